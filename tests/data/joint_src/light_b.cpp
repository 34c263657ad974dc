#include "common.h"
long light_b() { return common_base() + 2; }
