#include "common.h"
int other_value() { return scale(5); }
