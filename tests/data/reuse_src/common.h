#pragma once
// Shared constants of the reuse fixture.
#define SCALE 3
static inline int scale(int x) { return x * SCALE; }
