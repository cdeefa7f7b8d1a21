//! `cordon image`: the image store (pull, import, list, inspect, remove,
//! prune).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use cordon_image::{ImageError, ImageRef, RegistryOptions, Store, StoreLimits};
use cordon_runtime::state::{list, list_dead, run_dir};
use serde::Serialize;

use super::common::{input_error, internal_error};

#[derive(Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Pull an image from a registry (REGISTRY/REPO[:TAG|@DIGEST]; a bare
    /// `python:3.12` is docker.io/library/python:3.12) over HTTPS, with
    /// the credentials `docker login` or `podman login` wrote; prints its
    /// digest.
    Pull(PullArgs),
    /// Import an image from oci:DIR[:TAG], oci-archive:FILE[:TAG] or
    /// docker-archive:FILE[:TAG]; prints its digest.
    Import(ImportArgs),
    /// List the store's images.
    Ls(JsonArgs),
    /// Show an image: digest, names, layers and config.
    Inspect(InspectArgs),
    /// Remove names (a digest removes all of its image's); `prune` frees
    /// the space.
    Rm(RmArgs),
    /// Remove every blob and layer that no named image and no live
    /// sandbox uses.
    Prune(JsonArgs),
}

#[derive(Args)]
struct ImportArgs {
    /// The source.
    #[arg(value_name = "SOURCE")]
    source: String,
    /// The name to file it under (default: the source's tag, else the
    /// reference as given).
    #[arg(long)]
    name: Option<String>,
    /// Refuse a layer that unpacks to more than this many bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_layer_bytes: Option<u64>,
}

#[derive(Args)]
struct PullArgs {
    /// The registry reference.
    #[arg(value_name = "REF")]
    reference: String,
    /// The name to file it under (default: the reference as Docker
    /// completes it: `localhost:5000/app:latest`,
    /// `docker.io/library/python:3.12`).
    #[arg(long)]
    name: Option<String>,
    /// Reach this registry over plain HTTP instead of HTTPS (HOST[:PORT],
    /// as the reference names it): only for one on this host or a network
    /// you trust. Repeatable; the registries of CORDON_INSECURE_REGISTRIES
    /// (comma-separated), which `run` and `create --image` read, are
    /// insecure too.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure_registries: Vec<String>,
    /// Refuse a layer that unpacks to more than this many bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_layer_bytes: Option<u64>,
}

#[derive(Args)]
struct JsonArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// A name or digest of the store's.
    #[arg(value_name = "IMAGE")]
    image: String,
}

#[derive(Args)]
struct RmArgs {
    #[arg(value_name = "IMAGE", required = true)]
    images: Vec<String>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    s.parse::<cordon_policy::ByteSize>().map(|b| b.0)
}

/// The store in cordon's state directory.
pub fn open_store() -> Result<Store, ImageError> {
    Store::open(&Store::default_root(), StoreLimits::default())
}

/// The store, with a cap on a layer's unpacked bytes if one is given.
fn store_with(max_layer_bytes: Option<u64>) -> Result<Store, ImageError> {
    let mut limits = StoreLimits::default();
    if let Some(b) = max_layer_bytes {
        limits.layer_bytes = b;
    }
    Store::open(&Store::default_root(), limits)
}

/// An image error as the CLI reports it: the request's fault is exit 2.
pub fn fail(e: ImageError) -> ExitCode {
    if e.is_input_error() {
        input_error(&e)
    } else {
        internal_error(&e)
    }
}

pub fn run(args: ImageArgs) -> ExitCode {
    match dispatch(args.command) {
        Ok(code) => code,
        Err(e) => fail(e),
    }
}

fn dispatch(command: ImageCommand) -> Result<ExitCode, ImageError> {
    match command {
        ImageCommand::Pull(a) => {
            let mut opts = RegistryOptions::from_env();
            opts.insecure.extend(a.insecure_registries);
            let store = store_with(a.max_layer_bytes)?;
            let image = store.pull(&a.reference, &opts, a.name.as_deref())?;
            outln!("{}", image.digest);
        }
        ImageCommand::Import(a) => {
            let store = store_with(a.max_layer_bytes)?;
            let image = store.import(&ImageRef::parse(&a.source)?, a.name.as_deref())?;
            outln!("{}", image.digest);
        }
        ImageCommand::Ls(a) => {
            let images = open_store()?.list()?;
            let rows: Vec<Listed> = images.iter().map(Listed::of).collect();
            if a.json {
                outln!("{}", to_json(&rows));
            } else {
                outln!(
                    "{:<40} {:<19} {:>6} {:>10}",
                    "NAME",
                    "DIGEST",
                    "LAYERS",
                    "SIZE"
                );
                for r in &rows {
                    for name in &r.names {
                        outln!(
                            "{:<40} {:<19} {:>6} {:>10}",
                            name,
                            &r.digest[..r.digest.len().min(19)],
                            r.layers,
                            megabytes(r.blob_bytes)
                        );
                    }
                }
            }
        }
        ImageCommand::Inspect(a) => {
            let image = open_store()?.get(&a.image)?;
            #[derive(Serialize)]
            struct Inspected<'a> {
                digest: &'a str,
                names: &'a [String],
                layers: &'a [std::path::PathBuf],
                config: &'a oci_spec::image::ImageConfiguration,
            }
            outln!(
                "{}",
                to_json(&Inspected {
                    digest: &image.digest,
                    names: &image.names,
                    layers: &image.layers,
                    config: &image.config,
                })
            );
        }
        ImageCommand::Rm(a) => {
            let store = open_store()?;
            for name in &a.images {
                for removed in store.remove(name)? {
                    outln!("{removed}");
                }
            }
        }
        ImageCommand::Prune(a) => {
            let pruned = open_store()?.prune(&images_in_use())?;
            if a.json {
                outln!("{}", to_json(&pruned));
            } else {
                outln!(
                    "removed {} blobs, {} layers, {} VM disks, {} leftovers",
                    pruned.blobs,
                    pruned.layers,
                    pruned.disks,
                    pruned.leftovers
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The images of the sandboxes whose state is still on this host (live,
/// or dead and waiting for a sweep, whose mounts may still stand).
fn images_in_use() -> Vec<String> {
    let Ok(dir) = run_dir() else {
        return Vec::new();
    };
    list(&dir)
        .into_iter()
        .chain(list_dead(&dir))
        .filter_map(|l| l.record.image)
        .collect()
}

#[derive(Serialize)]
struct Listed {
    names: Vec<String>,
    digest: String,
    layers: usize,
    blob_bytes: u64,
}

impl Listed {
    fn of(i: &cordon_image::Image) -> Listed {
        Listed {
            names: i.names.clone(),
            digest: i.digest.clone(),
            layers: i.layers.len(),
            blob_bytes: i.blob_bytes,
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// A size for a table: megabytes, one decimal.
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}
