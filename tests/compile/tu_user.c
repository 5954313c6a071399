/* Translation unit 2: the API only (no MEGABATCH_IMPLEMENTATION), linked against tu_impl. */
#include "megabatch.h"
#include <stdio.h>

int tu_user_main(void) {
    mb_device *dev = NULL;
    if (mb_device_open(&dev, NULL) != MB_OK) { printf("%s\n", mb_last_error()); return 1; }
    int64_t shape[2] = {4, 3};
    mb_params *p = NULL;
    int ok = mb_params_create(&p, dev) == MB_OK && mb_params_add(p, "w", 2, shape, 0.5f, NULL) == MB_OK &&
             mb_params_finalize(p) == MB_OK && mb_params_init(p, 7) == MB_OK;
    mb_params_destroy(p);
    mb_device_close(dev);
    return ok ? 0 : 1;
}
