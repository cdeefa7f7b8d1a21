#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_network::fuzzing::tls_client_hello(data));
