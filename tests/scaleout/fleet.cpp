#include "fleet.hpp"

#include <pqxx/pqxx>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace im::scaleout {

namespace fs = std::filesystem;

// ------------------------------------------------------------------ Fleet

std::string Fleet::warnings(std::size_t per_gateway) const {
    std::string out;
    for (std::size_t i = 0; i < gws_.size(); ++i) {
        std::vector<std::string> lines;
        std::istringstream log(gws_[i]->log());
        for (std::string line; std::getline(log, line);)
            if (line.find("\"level\":\"warn\"") != std::string::npos ||
                line.find("\"level\":\"error\"") != std::string::npos)
                lines.push_back(line);
        if (lines.empty()) continue;
        out += "\n  gw" + std::to_string(i + 1) + " logged " + std::to_string(lines.size()) + " warning(s)/error(s)" +
               (lines.size() > per_gateway ? ", the last " + std::to_string(per_gateway) : std::string()) + ":";
        for (std::size_t k = lines.size() > per_gateway ? lines.size() - per_gateway : 0; k < lines.size(); ++k)
            out += "\n    " + lines[k];
    }
    return out;
}

Fleet::Fleet(const LabEnv& env, const std::string& db_url, const std::vector<std::string>& gateway_flags)
    : dir_("imfleet") {
    for (int i = 0; i < 3; ++i) ports_.push_back(free_port());
    front_ = free_port();
    stats_ = free_port();
    for (std::size_t i = 0; i < ports_.size(); ++i) {
        std::vector<std::string> flags = gateway_flags;
        // HAProxy (on this host) writes a PROXY v2 header naming each
        // client (send-proxy-v2 in haproxy.cfg): the gateways take it from
        // its address only.
        flags.insert(flags.end(), {"--listen", "127.0.0.1:" + std::to_string(ports_[i]), "--trusted-proxies",
                                   "127.0.0.1/32"});
        gws_.push_back(std::make_unique<test::ServerProcess>(db_url, flags, "gw-" + std::to_string(i + 1)));
    }
    render(env.config_dir + "/haproxy.cfg", haproxy_cfg(),
           {{"FRONT_PORT", std::to_string(front_)},
            {"STATS_PORT", std::to_string(stats_)},
            {"GW1_PORT", std::to_string(ports_[0])},
            {"GW2_PORT", std::to_string(ports_[1])},
            {"GW3_PORT", std::to_string(ports_[2])}});
    haproxy_ = std::make_unique<Proc>(std::vector<std::string>{"haproxy", "-db", "-f", haproxy_cfg()},
                                      dir_.path() + "/haproxy.log");
    try {
        wait_until(
            [&] {
                for (std::size_t i = 0; i < gws_.size(); ++i)
                    if (status(i) != "UP") return false;
                return true;
            },
            60s, "HAProxy to see every gateway UP");
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string(e.what()) + "\nhaproxy log:\n" + haproxy_->log_tail());
    }
}

Fleet::~Fleet() {
    haproxy_.reset();
    gws_.clear();
}

std::string Fleet::ws_url() const { return "ws://127.0.0.1:" + std::to_string(front_) + "/v1/ws"; }

std::string Fleet::status(std::size_t i) const {
    auto r = http_get(stats_, "/stats;csv");
    if (!r || r->first != 200) return "NO_STATS";
    std::istringstream in(r->second);
    std::string header, line;
    std::getline(in, header);
    auto split = [](const std::string& s) {
        std::vector<std::string> v;
        std::string cell;
        std::istringstream cs(s);
        while (std::getline(cs, cell, ',')) v.push_back(cell);
        return v;
    };
    auto cols = split(header.size() > 2 ? header.substr(2) : header); // "# pxname,..."
    std::size_t status_col = 0;
    for (std::size_t c = 0; c < cols.size(); ++c)
        if (cols[c] == "status") status_col = c;
    const std::string name = "gw" + std::to_string(i + 1);
    while (std::getline(in, line)) {
        auto v = split(line);
        if (v.size() > status_col && v[0] == "gateways" && v[1] == name) return v[status_col];
    }
    return "MISSING";
}

// ------------------------------------------------------------------ Clients

ClientFacts facts_of(const ClientRun& c) {
    ClientFacts f;
    for (const auto& line : read_lines(c.out)) {
        std::istringstream in(line);
        std::string word, a, b;
        in >> word >> a;
        std::getline(in >> std::ws, b);
        if (word == "SENT") f.sent[a] = b;
        else if (word == "ACK") f.acked[a] = std::stoll(b);
        else if (word == "FAILED") f.failed.push_back(a + " " + b);
        else if (word == "GATEWAY") f.gateways.push_back(a);
        else if (word == "RETRY") ++f.retries[b.substr(0, b.find(' '))];
        else if (word == "DRAINED") f.drained = true;
        else if (word == "CONVERGED") f.converged = a + " " + b;
    }
    return f;
}

Clients::Clients(const LabEnv& env, const std::string& ws_url, const std::vector<test::World>& worlds,
                 int interval_ms)
    : dir_("imclients") {
    stop_file_ = dir_.path() + "/stop";
    for (const auto& w : worlds)
        for (const auto& u : w.users) {
            ClientRun r;
            r.user = u.user;
            r.conv = w.conv;
            r.prefix = u.user;
            r.out = dir_.path() + "/" + u.user + ".out";
            r.proc = std::make_unique<Proc>(
                std::vector<std::string>{env.client_bin, dir_.path() + "/" + u.user + ".db", ws_url, u.token, w.conv,
                                         r.prefix, std::to_string(interval_ms), stop_file_},
                dir_.path() + "/" + u.user + ".log", false, r.out); // stdout: the facts
            runs_.push_back(std::move(r));
        }
}

Clients::~Clients() { runs_.clear(); }

std::size_t Clients::total_acked() const {
    std::size_t n = 0;
    for (const auto& r : runs_) n += facts_of(r).acked.size();
    return n;
}

void Clients::wait_each_acked(std::size_t n, std::chrono::milliseconds timeout) const {
    wait_all(
        [&] {
            for (const auto& r : runs_)
                if (facts_of(r).acked.size() < n) return false;
            return true;
        },
        timeout, "every client to have " + std::to_string(n) + " acknowledged sends");
}

void Clients::wait_all(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                       const std::string& what) const {
    try {
        wait_until(pred, timeout, what);
    } catch (const std::runtime_error& e) {
        throw std::runtime_error(e.what() + describe());
    }
}

std::string Clients::describe() const {
    std::string s;
    for (const auto& r : runs_) {
        auto f = facts_of(r);
        s += "\n  " + r.user + ": sent " + std::to_string(f.sent.size()) + ", acked " + std::to_string(f.acked.size()) +
             ", gateways " + std::to_string(f.gateways.size()) + (f.drained ? ", drained" : "") +
             (f.converged ? ", converged" : "") + "; stderr: " + r.proc->log_tail(400);
    }
    return s;
}

void Clients::stop_and_converge(std::chrono::milliseconds timeout) {
    std::ofstream(stop_file_) << "stop\n";
    wait_all(
        [&] {
            for (const auto& r : runs_)
                if (!facts_of(r).drained) return false;
            return true;
        },
        timeout, "every client's outbox to drain");
    std::ofstream(stop_file_ + ".sync") << "sync\n";
    wait_all(
        [&] {
            for (const auto& r : runs_)
                if (!facts_of(r).converged) return false;
            return true;
        },
        timeout, "every client to sync to the server's head");
    for (auto& r : runs_) r.proc->wait_exit(10s);
}

// ------------------------------------------------------------------ verdict

std::string Verdict::summary() const {
    std::ostringstream o;
    o << "sent=" << sent << " acked=" << acked << " lost=" << lost << " doubled=" << doubled
      << " unacked=" << unacked << " failed=" << failed << " gaps=" << gaps << " diverged=" << diverged
      << " stray=" << stray << " reconnects=" << reconnects << " retries=";
    if (retries.empty()) o << 0;
    for (auto it = retries.begin(); it != retries.end(); ++it)
        o << (it == retries.begin() ? "" : ",") << it->first << ":" << it->second;
    return o.str();
}

namespace {

std::string digest(const std::map<std::int64_t, std::string>& rows) {
    std::uint64_t h = 1469598103934665603ULL;
    for (const auto& [seq, body] : rows)
        for (unsigned char ch : std::to_string(seq) + " " + body + "\n") {
            h ^= ch;
            h *= 1099511628211ULL;
        }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

} // namespace

Verdict verify(const std::string& db_url, const Clients& clients) {
    Verdict v;
    pqxx::connection c(db_url);
    pqxx::nontransaction tx(c);
    std::set<std::string> convs;
    for (const auto& r : clients.runs()) convs.insert(r.conv);
    // The server's rows, per conversation.
    std::map<std::string, std::map<std::string, std::int64_t>> seq_of_cmid; // conv -> cmid -> seq
    std::map<std::string, std::map<std::int64_t, std::string>> msgs;        // conv -> seq -> body
    std::map<std::string, long> body_count;
    for (const auto& conv : convs) {
        for (const auto& row : tx.exec_params(
                 "SELECT seq, body, client_msg_id FROM events WHERE conv_id = $1 AND kind = 'msg' ORDER BY seq", conv)) {
            auto seq = row[0].as<std::int64_t>();
            msgs[conv][seq] = row[1].c_str();
            seq_of_cmid[conv][row[2].c_str()] = seq;
            ++body_count[row[1].c_str()];
        }
        auto g = tx.exec_params("SELECT count(*), coalesce(min(seq), 1), coalesce(max(seq), 0) FROM events "
                                "WHERE conv_id = $1", conv)[0];
        if (g[1].as<std::int64_t>() != 1 || g[0].as<std::int64_t>() != g[2].as<std::int64_t>()) {
            ++v.gaps;
            v.problems.push_back(conv + ": seqs are not 1.." + g[2].c_str() + " (" + g[0].c_str() + " rows)");
        }
    }
    for (const auto& [body, n] : body_count)
        if (n > 1) {
            ++v.doubled;
            v.problems.push_back("body '" + body + "' stored " + std::to_string(n) + " times");
        }
    std::set<std::string> all_bodies;
    for (const auto& r : clients.runs()) {
        auto f = facts_of(r);
        v.sent += static_cast<long>(f.sent.size());
        v.acked += static_cast<long>(f.acked.size());
        v.failed += static_cast<long>(f.failed.size());
        v.reconnects += f.gateways.empty() ? 0 : static_cast<long>(f.gateways.size()) - 1;
        for (const auto& [error, n] : f.retries) v.retries[error] += n;
        for (const auto& e : f.failed) v.problems.push_back(r.user + ": failed " + e);
        for (const auto& [cmid, body] : f.sent) {
            all_bodies.insert(body);
            auto a = f.acked.find(cmid);
            if (a == f.acked.end()) {
                ++v.unacked;
                v.problems.push_back(r.user + ": " + body + " never acknowledged");
                continue;
            }
            auto& stored = seq_of_cmid[r.conv];
            auto s = stored.find(cmid);
            if (s == stored.end() || s->second != a->second || msgs[r.conv][a->second] != body) {
                ++v.lost;
                v.problems.push_back(r.user + ": acknowledged " + body + " at seq " + std::to_string(a->second) +
                                     " is not stored there");
            }
        }
        const std::string want = std::to_string(msgs[r.conv].size()) + " " +
                                 std::to_string(msgs[r.conv].empty() ? 0 : msgs[r.conv].rbegin()->first) + " " +
                                 digest(msgs[r.conv]);
        if (!f.converged || *f.converged != want) {
            ++v.diverged;
            v.problems.push_back(r.user + ": local copy " + f.converged.value_or("(none)") + ", server " + want);
        }
    }
    for (const auto& [conv, rows] : msgs)
        for (const auto& [seq, body] : rows)
            if (!all_bodies.count(body)) {
                ++v.stray;
                v.problems.push_back(conv + ": seq " + std::to_string(seq) + " holds '" + body + "' nobody sent");
            }
    return v;
}

} // namespace im::scaleout
