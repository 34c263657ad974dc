// The heavy unit: the compiler evaluates HEAVY_PARTS constexpr loops of a million steps each (about 1.5 s
// apiece on the 2-core machine; each stays within g++'s default limit of operations per constant). It
// reads JOINT_FLAVOR, which every variant defines its own way, so no variant may reuse another's object.
#include <utility>

#include "common.h"

#if JOINT_FLAVOR == 0
#error "flavor 0 does not build"
#endif

constexpr long spin(long seed) {
    long s = 0;
    for (long i = 0; i < 1000; ++i)
        for (long j = 0; j < 1000; ++j) s += (i ^ j ^ seed) % 7;
    return s;
}

template <long K>
long part() {
    constexpr long v = spin(K);
    return v;
}

template <long... K>
long parts(std::integer_sequence<long, K...>) {
    return (part<K>() + ... + 0);
}

long heavy_value() { return parts(std::make_integer_sequence<long, HEAVY_PARTS>{}) % 1000 + JOINT_FLAVOR; }
