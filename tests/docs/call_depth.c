/* call_depth.c - GCC's -finstrument-functions hooks for tests/docs/call_depth.sh: linked into a
 * program built with that flag, it records for every function entered, and for each function
 * main called on the way (the path's third entry: train_step under train), the deepest path
 * from main it was entered by, and writes them at exit to $CALL_DEPTH_OUT, one a line:
 * "DEPTH ADDR ADDR ..." (main first; addresses for addr2line). One thread's paths only: the
 * script runs the program on one thread, where every pool job's items run on the caller. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define CD_HOOK __attribute__((no_instrument_function))
enum { CD_MAXD = 128, CD_SLOTS = 8192 };
static __thread void *cd_stack[CD_MAXD];
static __thread int cd_depth;
static struct { void *fn, *root; int depth; void *path[CD_MAXD]; } cd_tab[CD_SLOTS];
static pthread_mutex_t cd_mu = PTHREAD_MUTEX_INITIALIZER;

CD_HOOK void __cyg_profile_func_enter(void *fn, void *site) {
    (void)site;
    if (cd_depth < CD_MAXD) cd_stack[cd_depth] = fn;
    if (++cd_depth > CD_MAXD) return;
    void *root = cd_depth > 2 ? cd_stack[2] : NULL;
    size_t h = (((size_t)fn ^ (size_t)root) >> 4) % CD_SLOTS;
    pthread_mutex_lock(&cd_mu);
    while (cd_tab[h].fn && (cd_tab[h].fn != fn || cd_tab[h].root != root)) h = (h + 1) % CD_SLOTS;
    if (!cd_tab[h].fn || cd_depth > cd_tab[h].depth) {
        cd_tab[h].fn = fn; cd_tab[h].root = root; cd_tab[h].depth = cd_depth;
        for (int i = 0; i < cd_depth; i++) cd_tab[h].path[i] = cd_stack[i];
    }
    pthread_mutex_unlock(&cd_mu);
}

CD_HOOK void __cyg_profile_func_exit(void *fn, void *site) {
    (void)fn; (void)site;
    cd_depth--;
}

CD_HOOK __attribute__((destructor)) static void cd_write(void) {
    const char *name = getenv("CALL_DEPTH_OUT");
    FILE *f = name ? fopen(name, "w") : NULL;
    if (!f) return;
    for (int i = 0; i < CD_SLOTS; i++) {
        if (!cd_tab[i].fn) continue;
        fprintf(f, "%d", cd_tab[i].depth);
        for (int k = 0; k < cd_tab[i].depth; k++) fprintf(f, " %p", cd_tab[i].path[k]);
        fprintf(f, "\n");
    }
    fclose(f);
}
