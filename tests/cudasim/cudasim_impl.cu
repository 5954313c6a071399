/* The simulator's implementation (tests/cudasim/cudasim.h, force-included), compiled once per
 * build (make: build/VARIANT/cudasim.o) and linked into each of its programs. */
