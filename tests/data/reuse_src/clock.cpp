const char* build_time() { return __TIME__; }
