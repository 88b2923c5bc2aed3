// Reading the configuration: flags, environment variables and the file, in
// that order of precedence, each checked by its option's row
// (config_options.cpp); the database's connection string.
#include "core/config_option.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace im {

using namespace config_detail;

namespace {

const Option* find_flag(const std::string& name) {
    for (const auto& o : options())
        if (name == o.flag) return &o;
    return nullptr;
}

const Option* find_key(const std::string& key) {
    for (const auto& o : options())
        if (o.in_file && key == key_of(o)) return &o;
    return nullptr;
}

struct Setting {
    std::string value;
    std::string origin;
};

// Reads `key = value` lines. Unknown keys are
// errors (a typo must not pass silently).
std::optional<std::string> read_file(const std::string& path, std::map<const Option*, std::vector<Setting>>& out) {
    std::ifstream in(path);
    if (!in) return "cannot read configuration file " + path;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        // A '#' at the start or after a blank starts a comment.
        for (std::size_t h = line.find('#'); h != std::string::npos; h = line.find('#', h + 1))
            if (h == 0 || line[h - 1] == ' ' || line[h - 1] == '\t') {
                line.erase(h);
                break;
            }
        std::string t = trim(line);
        if (t.empty()) continue;
        auto eq = t.find('=');
        std::string where = path + ":" + std::to_string(n);
        if (eq == std::string::npos) return where + ": expected 'key = value'";
        std::string key = trim(t.substr(0, eq));
        const Option* o = find_key(key);
        if (!o) return where + ": unknown key '" + key + "'";
        out[o].push_back({trim(t.substr(eq + 1)), where});
    }
    return std::nullopt;
}

std::optional<std::string> read_secret(const std::string& path, std::string& out) {
    std::ifstream in(path);
    if (!in) return "cannot read " + path;
    std::string line;
    std::getline(in, line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return path + " is empty";
    out = line;
    return std::nullopt;
}

bool is_uri(const std::string& s) { return s.rfind("postgresql://", 0) == 0 || s.rfind("postgres://", 0) == 0; }

std::string percent_encode(const std::string& s) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char ch : s) {
        if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') out += static_cast<char>(ch);
        else {
            out += '%';
            out += hex[ch >> 4];
            out += hex[ch & 15];
        }
    }
    return out;
}

} // namespace

bool is_config_flag(const std::string& arg, ConfigScope scope, bool& takes_value) {
    const Option* o = find_flag(arg.substr(0, arg.find('=')));
    if (!o || !(o->scope & scope_bit(scope))) return false;
    takes_value = o->arg && arg.find('=') == std::string::npos;
    return true;
}

std::optional<std::string> parse_config(const std::vector<std::string>& args, Config& cfg, ConfigScope scope,
                                        ConfigAction& action) {
    action = ConfigAction::run;
    const unsigned bit = scope_bit(scope);
    std::map<const Option*, std::vector<Setting>> flags, file;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            action = ConfigAction::help;
            return std::nullopt;
        }
        if (a == "--print-config" && scope == ConfigScope::gateway) {
            action = ConfigAction::print_config;
            continue;
        }
        auto eq = a.find('=');
        const Option* o = find_flag(a.substr(0, eq));
        if (!o || !(o->scope & bit)) return "unknown option '" + a + "' (see --help)";
        std::string value;
        if (!o->arg) value = eq == std::string::npos ? "1" : a.substr(eq + 1);
        else if (eq != std::string::npos) value = a.substr(eq + 1);
        else if (i + 1 < args.size()) value = args[++i];
        else return std::string(o->flag) + " needs " + o->arg;
        flags[o].push_back({value, "flag"});
    }

    // Which file: --config, else IM_CONFIG (set but empty: none), else the
    // default one if it exists. A named file must exist.
    const Option* config_opt = find_flag("--config");
    std::string path;
    bool named = false;
    if (flags.count(config_opt)) path = flags[config_opt].back().value, named = true;
    else if (const char* v = std::getenv("IM_CONFIG")) path = v, named = true;
    else if (std::filesystem::exists(default_config_file)) path = default_config_file;
    if (!path.empty()) {
        if (auto e = read_file(path, file)) return e;
    }
    cfg.config_file = path;
    cfg.origin["config"] = named ? (flags.count(config_opt) ? "flag" : "env IM_CONFIG") : "default";

    for (const auto& o : options()) {
        if (!(o.scope & bit) || &o == config_opt) continue;
        std::vector<Setting> chosen;
        if (auto it = flags.find(&o); it != flags.end()) chosen = it->second;
        else if (const char* v = o.env ? std::getenv(o.env) : nullptr; v && *v) chosen = {{v, std::string("env ") + o.env}};
        else if (auto f = file.find(&o); f != file.end()) chosen = f->second;
        for (const auto& s : chosen) {
            if (auto e = o.set(cfg, s.value)) {
                std::string where = s.origin == "flag" ? std::string(o.flag) : s.origin;
                return where + ": " + *e;
            }
            cfg.origin[key_of(o)] = s.origin;
        }
    }

    if (!cfg.db_password_file.empty()) {
        if (!cfg.db_url) return "--db-password-file needs --db (the embedded cluster has no password)";
        if (auto e = read_secret(cfg.db_password_file, cfg.db_password)) return "--db-password-file: " + *e;
    }
    if (cfg.tls_cert.empty() != cfg.tls_key.empty()) return "--tls-cert and --tls-key go together";
    if (scope == ConfigScope::gateway && cfg.metrics_listen == "api" && cfg.api_listen.empty())
        return "--metrics-listen api needs the backend API (--api-listen is off)";
    if ((!cfg.jwt_issuer.empty() || !cfg.jwt_audience.empty()) && !cfg.jwt_enabled())
        return "--jwt-issuer and --jwt-audience need --jwt-hs256-secret-file or --jwt-jwks";
    if (!cfg.enable_faults && (!cfg.faults.empty() || cfg.lab.no_unique_index || cfg.lab.purge_without_tombstones ||
                                cfg.lab.erase_without_tombstones || cfg.lab.no_resync))
        return "--fault and --lab-* need --enable-faults";
    return std::nullopt;
}

std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, ConfigAction& action) {
    return parse_config(std::vector<std::string>(argv + 1, argv + argc), cfg, ConfigScope::gateway, action);
}

std::optional<std::string> db_conninfo(const Config& cfg) {
    if (!cfg.db_url || cfg.db_password.empty()) return cfg.db_url;
    const std::string& url = *cfg.db_url;
    if (is_uri(url)) return url + (url.find('?') == std::string::npos ? "?" : "&") + "password=" + percent_encode(cfg.db_password);
    std::string quoted;
    for (char ch : cfg.db_password) {
        if (ch == '\'' || ch == '\\') quoted += '\\';
        quoted += ch;
    }
    return url + " password='" + quoted + "'";
}

std::string mask_conninfo(const std::string& s) {
    std::string out = s;
    if (is_uri(out)) {
        // postgresql://user:PASSWORD@host...
        auto scheme = out.find("://") + 3;
        auto at = out.find('@', scheme);
        auto slash = out.find('/', scheme);
        if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
            auto colon = out.find(':', scheme);
            if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "****");
        }
    }
    // password=... as a keyword or a URL query parameter.
    for (std::size_t pos = 0; (pos = out.find("password", pos)) != std::string::npos;) {
        std::size_t p = pos + 8;
        while (p < out.size() && out[p] == ' ') ++p;
        bool starts_word = pos == 0 || out[pos - 1] == ' ' || out[pos - 1] == '?' || out[pos - 1] == '&';
        if (!starts_word || p >= out.size() || out[p] != '=') {
            pos = p;
            continue;
        }
        ++p;
        while (p < out.size() && out[p] == ' ') ++p;
        std::size_t end = p;
        if (end < out.size() && out[end] == '\'') {
            ++end;
            while (end < out.size() && out[end] != '\'') end += out[end] == '\\' ? 2 : 1;
            end = std::min(end + 1, out.size());
        } else {
            while (end < out.size() && out[end] != ' ' && out[end] != '&') ++end;
        }
        out.replace(p, end - p, "****");
        pos = p + 4;
    }
    return out;
}

std::vector<std::string> nats_servers(const std::string& bus) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (;;) {
        auto comma = bus.find(',', start);
        out.push_back(bus.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

std::size_t effective_db_queue(const Config& c) {
    if (c.db_queue) return c.db_queue;
    return std::max<std::size_t>(1024, static_cast<std::size_t>(c.max_connections));
}

int effective_send_workers(const Config& c) {
    int n = c.send_workers;
    // auto: half the cores, at least 1. On the 2-core machine that also runs
    // PostgreSQL one send worker made larger groups and spent less database
    // CPU per send at every load (docs/benchmarks.md, "One send worker
    // against two").
    if (n == 0) n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
    return std::max(1, std::min(n, c.db_pool));
}

} // namespace im
