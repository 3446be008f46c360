//! profiler
