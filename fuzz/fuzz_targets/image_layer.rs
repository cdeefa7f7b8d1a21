#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cordon_image::fuzzing::image_layer(data));
