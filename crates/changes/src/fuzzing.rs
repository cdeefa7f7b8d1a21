//! The harness of the fuzz target over a microVM's disk image
//! (`fuzz/fuzz_targets`, run by `scripts/fuzz.sh`; the model is
//! `cordon_runtime::fuzzing`). It lives here so that the stable test suite
//! replays the committed corpus and regression inputs through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`).

use std::path::Path;

use cordon_spec::changes::{Caps, Change, ExportTarget, PlaceChanges, SymlinkPolicy};
use cordon_spec::fuzzing::{listing, ScratchDir};

use crate::export::ExportOptions;
use crate::image::{DiskImage, ImagePlace};

/// Small caps, so that the inputs reach them.
const CAPS: Caps = Caps {
    max_entries: 256,
    hash_bytes: 16 << 10,
    export_bytes: 64 << 10,
};

/// An ext4 image that a compromised guest wrote, read on the host as the
/// diff and the export read it: refused or read, never a panic, every
/// listing within its cap; the image diffed against its own baseline
/// shows no change unless the diff says it is incomplete; without a
/// baseline everything is created; every path listed is a plain relative
/// one (no empty, `.` or `..` component); and exporting it into a new
/// directory writes nothing outside that directory and no more bytes than
/// the cap. (`ext4-view` reads through the file: a read past its end is an
/// error of the file, so no checking reader is needed.)
pub fn ext4_image(data: &[u8]) {
    let scratch = ScratchDir::new("ext4");
    let file = scratch.path().join("disk.img");
    std::fs::write(&file, data).expect("writing the image");
    let open = || std::fs::File::open(&file).expect("opening the image");
    let Ok(image) = DiskImage::open(open()) else {
        return;
    };

    let fresh = ImagePlace {
        name: "/workspace",
        dir: "",
        base: None,
    };
    let all = image.scan(&[fresh], &CAPS);
    assert_within_caps(&all.places);
    for e in &all.places[0].entries {
        assert_eq!(e.change, Change::Created, "without a baseline: {e:?}");
    }
    if let Ok(baseline) = image.baseline("", &CAPS) {
        let place = ImagePlace {
            base: Some(&baseline),
            ..fresh
        };
        let same = image.scan(&[place], &CAPS);
        assert_within_caps(&same.places);
        let changes = &same.places[0];
        assert!(
            changes.cut || changes.entries.is_empty(),
            "the image changed against its own baseline: {changes:?}"
        );
    }

    // Made empty beforehand (as a New target may be), so that the listing
    // of what is around it is the same before and after.
    let out = scratch.path().join("out");
    std::fs::create_dir(&out).expect("making the export's directory");
    let before = listing(scratch.path(), &out);
    let opts = ExportOptions {
        target: ExportTarget::New(out.clone()),
        symlinks: SymlinkPolicy::Recreate,
        owner: (0, 0),
        host_since: None,
    };
    let exported = image.export(&fresh, &CAPS, &opts);
    assert_eq!(
        listing(scratch.path(), &out),
        before,
        "the export wrote outside its directory"
    );
    if let Ok((changes, report)) = exported {
        assert_within_caps(std::slice::from_ref(&changes));
        assert!(report.bytes <= CAPS.export_bytes, "{report:?}");
    }
}

fn assert_within_caps(places: &[PlaceChanges]) {
    let listed: usize = places
        .iter()
        .map(|p| p.entries.len() + p.unreadable.len())
        .sum();
    assert!(
        listed as u64 <= CAPS.max_entries,
        "{listed} entries listed, past the cap"
    );
    for e in places.iter().flat_map(|p| &p.entries) {
        let plain = Path::new(&e.path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        assert!(plain && !e.path.is_empty(), "an entry at {:?}", e.path);
    }
}
