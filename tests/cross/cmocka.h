/* tests/cross/cmocka.h - the part of cmocka's API that tests/test_*.c use, for the cross
 * builds (Windows under Wine, ARM64 under qemu-aarch64), where no cmocka library exists:
 * Debian packages none for MinGW-w64, and arm64's needs multiarch (dpkg --add-architecture)
 * on the CI machine. Header-only; found before any system <cmocka.h> through -Itests/cross.
 *
 * Same semantics as cmocka where the tests can tell: a failed assertion or fail() ends the
 * test (longjmp) and marks it failed, skip() marks it skipped, the group's setup failing
 * fails every test, cmocka_run_group_tests returns the number of failed tests (the exit
 * status of main), and the lines printed are cmocka's ([ RUN ], [ OK ], [ FAILED ],
 * [ PASSED ]), so tests/run.sh-style greps work on both. Not here: mocks (will_return,
 * expect_*), test-level fixtures other than cmocka_unit_test_setup_teardown, XML output. */
#ifndef MB_CROSS_CMOCKA_H
#define MB_CROSS_CMOCKA_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define MBX_FN static __attribute__((unused))
#else
#define MBX_FN static
#endif

typedef uintmax_t LargestIntegralType;
typedef void (*CMUnitTestFunction)(void **state);
typedef int (*CMFixtureFunction)(void **state);
struct CMUnitTest {
    const char *name;
    CMUnitTestFunction test_func;
    CMFixtureFunction setup_func;
    CMFixtureFunction teardown_func;
    void *initial_state;
};

#define cmocka_unit_test(f) { #f, f, NULL, NULL, NULL }
#define cmocka_unit_test_setup_teardown(f, s, t) { #f, f, s, t, NULL }
#define cmocka_run_group_tests(tests, setup, teardown) \
    mbx_run_group(#tests, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)
#define cmocka_run_group_tests_name(name, tests, setup, teardown) \
    mbx_run_group(name, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

static jmp_buf mbx_jump;
static int mbx_in_test;
static const char *mbx_filter;

MBX_FN void print_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}
MBX_FN void print_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}
/* End the running test: failed (1) or skipped (2). Outside a test: exit. */
MBX_FN void mbx_end(int how) {
    if (!mbx_in_test) exit(1);
    longjmp(mbx_jump, how);
}
MBX_FN void mbx_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("[  ERROR   ] --- ");
    vprintf(fmt, ap);
    printf("\n[   LINE   ] --- %s:%d: error: Failure!\n", file, line);
    va_end(ap);
    fflush(stdout);
    mbx_end(1);
}

#define fail() mbx_fail(__FILE__, __LINE__, "fail()")
#define fail_msg(...) mbx_fail(__FILE__, __LINE__, __VA_ARGS__)
#define skip() mbx_end(2)
#define assert_true(c) ((c) ? (void)0 : mbx_fail(__FILE__, __LINE__, "%s", #c))
#define assert_false(c) (!(c) ? (void)0 : mbx_fail(__FILE__, __LINE__, "!(%s)", #c))
#define assert_non_null(p) ((p) != NULL ? (void)0 : mbx_fail(__FILE__, __LINE__, "%s is NULL", #p))
#define assert_null(p) ((p) == NULL ? (void)0 : mbx_fail(__FILE__, __LINE__, "%s is not NULL", #p))
#define assert_ptr_equal(a, b) \
    ((const void *)(a) == (const void *)(b) ? (void)0 : mbx_fail(__FILE__, __LINE__, "%p != %p", (const void *)(a), (const void *)(b)))
#define assert_int_equal(a, b) mbx_int(__FILE__, __LINE__, (LargestIntegralType)(a), (LargestIntegralType)(b), 1)
#define assert_int_not_equal(a, b) mbx_int(__FILE__, __LINE__, (LargestIntegralType)(a), (LargestIntegralType)(b), 0)
#define assert_in_range(v, lo, hi) \
    mbx_range(__FILE__, __LINE__, (LargestIntegralType)(v), (LargestIntegralType)(lo), (LargestIntegralType)(hi))
#define assert_string_equal(a, b) mbx_str(__FILE__, __LINE__, (a), (b), 1)
#define assert_string_not_equal(a, b) mbx_str(__FILE__, __LINE__, (a), (b), 0)
#define assert_memory_equal(a, b, n) mbx_mem(__FILE__, __LINE__, (a), (b), (size_t)(n), 1)
#define assert_memory_not_equal(a, b, n) mbx_mem(__FILE__, __LINE__, (a), (b), (size_t)(n), 0)

MBX_FN void mbx_int(const char *file, int line, LargestIntegralType a, LargestIntegralType b, int eq) {
    if ((a == b) != eq)
        mbx_fail(file, line, "%lld (%#llx) %s %lld (%#llx)", (long long)a, (unsigned long long)a, eq ? "!=" : "==",
                 (long long)b, (unsigned long long)b);
}
MBX_FN void mbx_range(const char *file, int line, LargestIntegralType v, LargestIntegralType lo,
                      LargestIntegralType hi) {
    if (v < lo || v > hi)
        mbx_fail(file, line, "%llu is not within the range [%llu, %llu]", (unsigned long long)v,
                 (unsigned long long)lo, (unsigned long long)hi);
}
MBX_FN void mbx_str(const char *file, int line, const char *a, const char *b, int eq) {
    if (!a || !b) mbx_fail(file, line, "NULL string");
    if ((strcmp(a, b) == 0) != eq) mbx_fail(file, line, "\"%s\" %s \"%s\"", a, eq ? "!=" : "==", b);
}
MBX_FN void mbx_mem(const char *file, int line, const void *a, const void *b, size_t n, int eq) {
    if (!a || !b) mbx_fail(file, line, "NULL buffer");
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (i < n && x[i] == y[i]) i++;
    if ((i == n) != eq) {
        if (eq) mbx_fail(file, line, "%zu bytes differ, the first at byte %zu (0x%02x != 0x%02x)", n, i, x[i], y[i]);
        mbx_fail(file, line, "%zu bytes are equal", n);
    }
}

/* cmocka's filter: tests whose names match the pattern ('*' and '?' wildcards) are skipped. */
MBX_FN void cmocka_set_skip_filter(const char *pattern) { mbx_filter = pattern; }
MBX_FN int mbx_match(const char *p, const char *s) {
    if (!*p) return !*s;
    if (*p == '*') return mbx_match(p + 1, s) || (*s && mbx_match(p, s + 1));
    return *s && (*p == '?' || *p == *s) && mbx_match(p + 1, s + 1);
}

/* One test: 0 passed, 1 failed, 2 skipped (the longjmp lands here, not in the group's frame). */
MBX_FN int mbx_run_one(const struct CMUnitTest *t, void *state) {
    mbx_in_test = 1;
    int how = setjmp(mbx_jump);
    if (how == 0) {
        if (t->setup_func && t->setup_func(&state) != 0) mbx_end(1);
        t->test_func(&state);
        if (t->teardown_func && t->teardown_func(&state) != 0) mbx_end(1);
    }
    mbx_in_test = 0;
    return how;
}

MBX_FN int mbx_run_group(const char *group, const struct CMUnitTest *t, size_t n, CMFixtureFunction setup,
                         CMFixtureFunction teardown) {
    void *group_state = NULL;
    size_t failed = 0, passed = 0, skipped = 0;
    printf("[==========] %s: Running %zu test(s).\n", group, n);
    fflush(stdout);
    int setup_failed = setup && setup(&group_state) != 0;
    if (setup_failed) printf("[  ERROR   ] %s: group setup failed\n", group);
    for (size_t i = 0; i < n; i++) {
        if (setup_failed) { failed++; printf("[  FAILED  ] %s\n", t[i].name); continue; }
        if (mbx_filter && mbx_match(mbx_filter, t[i].name)) { skipped++; continue; }
        void *state = t[i].initial_state ? t[i].initial_state : group_state;
        printf("[ RUN      ] %s\n", t[i].name);
        fflush(stdout);
        int how = mbx_run_one(&t[i], state);
        if (how == 1) { failed++; printf("[  FAILED  ] %s\n", t[i].name); }
        else if (how == 2) { skipped++; printf("[  SKIPPED ] %s\n", t[i].name); }
        else { passed++; printf("[       OK ] %s\n", t[i].name); }
        fflush(stdout);
    }
    if (teardown && teardown(&group_state) != 0) { printf("[  ERROR   ] %s: group teardown failed\n", group); failed++; }
    printf("[==========] %s: %zu test(s) run.\n", group, n);
    printf("[  PASSED  ] %zu test(s).\n", passed);
    if (skipped) printf("[  SKIPPED ] %zu test(s).\n", skipped);
    if (failed) printf("[  FAILED  ] %zu test(s).\n", failed);
    fflush(stdout);
    return (int)failed;
}
#endif /* MB_CROSS_CMOCKA_H */
