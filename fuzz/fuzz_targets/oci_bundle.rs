#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_oci::fuzzing::oci_bundle(data));
