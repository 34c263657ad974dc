#pragma once
// Read by every unit; names no identifier a variant defines, so it never stops a waiver.
static inline long common_base() { return 40; }
