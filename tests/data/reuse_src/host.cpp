#include "util.h"
#ifndef FEATURE
#define FEATURE 1
#endif
int host_value() { return twice(FEATURE); }
