/*
 * operation.c - what the operations share beyond their interface (operation.h): the names of
 * their outputs.
 */
#include "api/ops/operation.h"

const char *const api__out_names[API__N_OUTPUTS] = {"output", "weights", "lse"};
