/* Translation unit 3: a private static copy of the implementation (MEGABATCH_STATIC)
 * beside the extern one of tu_impl.c: the program must still link. */
#define MEGABATCH_STATIC
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"

int tu_static_probe(void);
int tu_static_probe(void) { return mb_dtype_size(MB_BF16) == 2 ? 0 : 1; }
