#include "name.h"
int named_value() { return named_constant(); }
