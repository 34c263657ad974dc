#include "common.h"
long light_a() { return common_base() + 1; }
