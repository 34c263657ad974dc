#pragma once
#include "common.h"
static inline int twice(int x) { return 2 * scale(x); }
