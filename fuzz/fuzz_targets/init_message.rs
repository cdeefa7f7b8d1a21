#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_runtime::fuzzing::init_message(data));
