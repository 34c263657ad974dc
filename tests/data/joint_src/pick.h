#pragma once
#define PICKED_HEADER "flavor.h"
