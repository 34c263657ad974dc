#pragma once
// Any unit including this header reads the identifier TORCH_EXTENSION_NAME, so its object is never shared
// between variants with different module names.
static inline int named_constant() { return 7; }
