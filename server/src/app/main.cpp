// imserver: a gateway of the chat contract (serve.cpp), or (`imserver admin
// ...`) the operator CLI (admin.cpp). Thin: options, then one of the two.
#include "app/admin.hpp"
#include "app/serve.hpp"
#include "core/config.hpp"
#include "core/log.hpp"

#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "admin") == 0) return im::admin_main(argc - 1, argv + 1);
    im::Config cfg;
    im::ConfigAction action = im::ConfigAction::run;
    if (auto e = im::parse_config(argc, argv, cfg, action)) {
        std::cerr << "imserver: " << *e << '\n';
        return 2;
    }
    if (action == im::ConfigAction::help) {
        std::cout << im::config_help();
        return 0;
    }
    if (action == im::ConfigAction::print_config) {
        std::cout << im::print_config(cfg);
        return 0;
    }
    try {
        return im::serve(cfg);
    } catch (const std::exception& e) {
        im::log_error("fatal", {{"err", e.what()}});
        std::cerr << "imserver: " << e.what() << '\n';
        return 1;
    }
}
