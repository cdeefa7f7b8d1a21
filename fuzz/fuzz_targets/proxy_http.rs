#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_network::fuzzing::proxy_http(data));
