// Build tool: writes imserver.8 and imserver-admin.8 into OUTDIR, rendered
// from the option and command tables that --help uses.
#include "app/admin.hpp"
#include "core/config.hpp"

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: imserver_mangen OUTDIR VERSION\n";
        return 2;
    }
    const std::string dir = argv[1];
    const std::string version = argv[2];
    for (const auto& [name, text] : {std::pair{"imserver.8", im::config_man(version)},
                                     std::pair{"imserver-admin.8", im::admin_man(version)}}) {
        std::ofstream f(dir + "/" + name, std::ios::trunc);
        f << text;
        if (!f) {
            std::cerr << "imserver_mangen: cannot write " << dir << "/" << name << '\n';
            return 1;
        }
    }
    return 0;
}
