#pragma once
static inline long flavor_value() { return 100 * JOINT_FLAVOR; }
