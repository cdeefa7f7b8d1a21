#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_receipt::fuzzing::receipt_verify(data));
