// An object above nginx's default request body limit (1 MiB): a 2 MiB table that is not all zeros, so the
// compiler emits every byte of it into .rodata.
#include "remote.h"

#define ROW16 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
#define ROW256 ROW16, ROW16, ROW16, ROW16, ROW16, ROW16, ROW16, ROW16, \
               ROW16, ROW16, ROW16, ROW16, ROW16, ROW16, ROW16, ROW16
#define ROW4K ROW256, ROW256, ROW256, ROW256, ROW256, ROW256, ROW256, ROW256, \
              ROW256, ROW256, ROW256, ROW256, ROW256, ROW256, ROW256, ROW256

// external linkage: the compiler must emit all of it, whatever the optimization level
extern const unsigned char remote_table[2 << 20];
const unsigned char remote_table[2 << 20] = {ROW4K};

long long table_sum() {
    long long s = 0;
    for (unsigned i = 0; i < sizeof(remote_table); ++i) s += remote_table[i];
    return s;
}
