// Rendering the configuration for people: --help, --print-config and the
// manual pages' option sections, all from the one option table.
#include "core/config_option.hpp"

#include <sstream>

namespace im {

using namespace config_detail;

namespace {

std::string pad(const std::string& left, std::size_t width) {
    return left.size() < width ? left + std::string(width - left.size(), ' ') : left + "\n  " + std::string(width, ' ');
}

} // namespace

std::string options_help(ConfigScope scope) {
    std::ostringstream o;
    for (const auto& opt : options()) {
        if (!(opt.scope & scope_bit(scope))) continue;
        o << "  " << pad(std::string(opt.flag) + (opt.arg ? std::string(" ") + opt.arg : ""), 30) << opt.help;
        if (opt.env) o << "  [" << opt.env << "]";
        o << '\n';
    }
    return o.str();
}

std::string config_help() {
    std::ostringstream o;
    o << "usage: imserver [OPTIONS]            run a gateway\n"
         "       imserver --print-config [OPTIONS]   show the effective configuration (secrets masked)\n"
         "       imserver admin [OPTIONS] COMMAND ...   (imserver admin --help)\n\n"
         "Options; each is also the environment variable shown and the key 'name = value'\n"
         "(the flag without '--') in the configuration file. A flag beats the environment,\n"
         "which beats the file:\n"
      << options_help(ConfigScope::gateway) << "  " << pad("--print-config", 30)
      << "print the effective configuration and exit\n"
      << "  " << pad("--help", 30) << "this text\n";
    return o.str();
}

std::string print_config(const Config& cfg) {
    std::ostringstream o;
    o << "# imserver: effective configuration (flag > environment > "
      << (cfg.config_file.empty() ? std::string("no file") : cfg.config_file) << " > default)\n";
    std::size_t width = 0;
    std::vector<std::pair<std::string, std::string>> lines;
    for (const auto& opt : options()) {
        if (!(opt.scope & for_gateway) || !opt.in_file) continue;
        std::string key = key_of(opt);
        std::string value = opt.get ? opt.get(cfg) : std::string();
        std::string line = value.empty() ? "# " + key + " =" : key + " = " + value;
        auto it = cfg.origin.find(key);
        width = std::max(width, line.size());
        lines.emplace_back(line, it == cfg.origin.end() ? "default" : it->second);
    }
    for (const auto& [line, origin] : lines) o << line << std::string(width + 2 - line.size(), ' ') << "# " << origin << '\n';
    if (!cfg.db_password.empty()) o << "# database password: **** (from " << cfg.db_password_file << ")\n";
    return o.str();
}

std::string roff_escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
        if (ch == '\\') out += "\\e";
        else if (ch == '-') out += "\\-";
        else out += ch;
    }
    if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
    return out;
}

std::string options_man(ConfigScope scope) {
    std::ostringstream o;
    for (const auto& opt : options()) {
        if (!(opt.scope & scope_bit(scope))) continue;
        o << ".TP\n\\fB" << roff_escape(opt.flag) << "\\fR";
        if (opt.arg) o << " \\fI" << roff_escape(opt.arg) << "\\fR";
        o << '\n' << roff_escape(opt.help) << ".\n";
        if (opt.env) {
            o << "Environment: \\fB" << roff_escape(opt.env) << "\\fR";
            if (opt.in_file) o << "; file key: \\fB" << roff_escape(key_of(opt)) << "\\fR";
            o << ".\n";
        }
    }
    return o.str();
}

std::string config_man(const std::string& version) {
    std::ostringstream o;
    o << ".TH IMSERVER 8 \"\" \"imserver " << version << "\" \"System Administration\"\n"
      << ".SH NAME\nimserver \\- chat gateway of the im contract (WebSocket and HTTP)\n"
      << ".SH SYNOPSIS\n.B imserver\n[\\fIOPTIONS\\fR]\n.br\n.B imserver \\-\\-print\\-config\n[\\fIOPTIONS\\fR]\n"
      << ".br\n.B imserver admin\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR ...\n"
      << ".SH DESCRIPTION\n"
         "\\fBimserver\\fR serves the chat contract over WebSocket (\\fB/v1/ws\\fR) and HTTP "
         "(\\fB/healthz\\fR, \\fB/readyz\\fR, \\fB/metrics\\fR), storing everything in PostgreSQL: "
         "the server given with \\fB\\-\\-db\\fR or an embedded cluster in the state directory. "
         "Migrations are applied at start. Any number of gateways may share one database.\n"
      << ".PP\nEvery option is a flag, an environment variable and a key of the configuration file. "
         "A flag beats the environment, which beats the file, which beats the default.\n"
      << ".SH OPTIONS\n"
      << options_man(ConfigScope::gateway)
      << ".TP\n\\fB\\-\\-print\\-config\\fR\nPrint the effective configuration in the file's format, each value "
         "with its origin, secrets masked, and exit.\n"
      << ".TP\n\\fB\\-\\-help\\fR\nPrint the options and exit.\n"
      << ".SH CONFIGURATION FILE\n"
         "Lines \\fIkey\\fR = \\fIvalue\\fR, where \\fIkey\\fR is the flag without its leading dashes; "
         "a # at the start of a line or after a blank starts a comment; switches take true or false; a repeatable "
         "option takes a comma-separated list. An unknown key is an error. "
         "Secrets are not written in the file: \\fBdb\\-password\\-file\\fR names a file holding the "
         "database password.\n"
      << ".SH SIGNALS\n.TP\n\\fBSIGTERM\\fR, \\fBSIGINT\\fR\nDrain: tell clients to go (goaway), finish "
         "requests in flight for up to \\fB\\-\\-drain\\-timeout\\-ms\\fR, exit 0.\n"
      << ".TP\n\\fBSIGHUP\\fR\nRe-read the TLS certificate and key: new connections use them, open ones keep "
         "theirs. Re-read the JWT keys (\\fB\\-\\-jwt\\-hs256\\-secret\\-file\\fR, \\fB\\-\\-jwt\\-jwks\\fR): "
         "tokens are checked with the new keys from then on, also at refresh. If a file is unusable the old "
         "certificate or keys stay and an error is logged.\n"
      << ".SH FILES\n.TP\n\\fI" << roff_escape(default_config_file) << "\\fR\nThe configuration file.\n"
      << ".TP\n\\fI/var/lib/imserver\\fR\nState directory of the packaged service (embedded PostgreSQL).\n"
      << ".SH EXIT STATUS\n0 after a drain, 1 on a fatal error, 2 on bad usage.\n"
      << ".SH SEE ALSO\n\\fBimserver\\-admin\\fR(8), \\fBsystemctl\\fR(1), /usr/share/doc/imserver/operations.md\n";
    return o.str();
}

} // namespace im
