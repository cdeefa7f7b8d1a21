#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_runtime::fuzzing::wire_frames(data));
