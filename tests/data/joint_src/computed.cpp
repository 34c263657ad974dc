// A computed include: the textual scan cannot follow it, so it predicts that this unit may wait for the
// first variant's object; the compiler's dependency list names flavor.h, which reads the variants' flavor
// define, so the waiver fails and the unit compiles after all.
#include "common.h"
#include "pick.h"
#include PICKED_HEADER
long computed_value() { return common_base() + flavor_value(); }
