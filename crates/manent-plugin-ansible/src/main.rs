//! `manent-plugin-ansible`: serves the manent plugin protocol on stdin/stdout and runs
//! `ansible-playbook` for each pass (see the library's documentation); run as
//! `manent-plugin-ansible ssh-guard …`, it is the `ssh` those runs use (`guard`).

fn main() {
    let mut args = std::env::args_os().skip(1);
    if args
        .next()
        .is_some_and(|a| a == manent_plugin_ansible::guard::SUBCOMMAND)
    {
        let error = manent_plugin_ansible::guard::ssh_main(args);
        eprintln!(
            "manent-plugin-ansible {}: {error}",
            manent_plugin_ansible::guard::SUBCOMMAND
        );
        // ssh's own status for an error of its own.
        std::process::exit(255);
    }
    if let Err(e) = manent_plugin::serve(manent_plugin_ansible::AnsiblePlugin::from_env()) {
        eprintln!("manent-plugin-ansible: {e}");
        std::process::exit(1);
    }
}
