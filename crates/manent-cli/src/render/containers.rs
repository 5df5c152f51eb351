//! The containers in `manent status` (docs/containers.md): per target under the `container`
//! plugin, the container it runs, its image's tag and id, and where the proxy sends new
//! requests.

use manent_contract::{DeployStatus, TargetView};

use super::{Cell, Style, table};

/// A `containers` table, one row per target with a container; empty when none has one.
pub(super) fn section(style: &Style, d: &DeployStatus) -> String {
    let with: Vec<&TargetView> = d.targets.iter().filter(|t| t.container.is_some()).collect();
    if with.is_empty() {
        return String::new();
    }
    let rows = table(
        style,
        &with,
        &["target", "container", "image", "image_digest", "proxy"],
        |t| {
            let Some(c) = &t.container else {
                return Vec::new();
            };
            vec![
                t.name.cell(),
                format!("{} ({})", c.name.cell(), c.address.cell()),
                c.image.cell(),
                c.image_digest.cell(),
                format!(
                    "{} -> {} ({})",
                    c.proxy.listen.cell(),
                    c.proxy.server.cell(),
                    c.proxy.upstream.cell()
                ),
            ]
        },
    );
    format!("\n\ncontainers\n{rows}")
}
