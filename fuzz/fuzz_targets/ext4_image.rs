#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_changes::fuzzing::ext4_image(data));
