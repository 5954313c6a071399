/* Translation unit 1 of the compile checks: holds the implementation. Built as C11
 * -pedantic and as C++17, and linked with tu_user.c. */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "megabatch.h" /* including twice is harmless */

int tu_user_main(void);
int main(void) { return tu_user_main(); }
