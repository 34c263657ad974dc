#pragma once

int kernel_value();
long long table_sum();
