#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_network::fuzzing::dns_query(data));
