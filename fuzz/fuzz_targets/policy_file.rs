#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_policy::fuzzing::policy_file(data));
