//! `manent-plugin-ansible`: serves the manent plugin protocol on stdin/stdout and runs
//! `ansible-playbook` for each pass (see the library's documentation).

fn main() {
    if let Err(e) = manent_plugin::serve(manent_plugin_ansible::AnsiblePlugin::from_env()) {
        eprintln!("manent-plugin-ansible: {e}");
        std::process::exit(1);
    }
}
