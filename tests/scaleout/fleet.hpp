// The pieces a scale-out scenario assembles: gateways behind HAProxy, SDK
// client processes sending through it, and the check of the outcome
// against the database's rows.
#pragma once

#include "harness.hpp"
#include "procs.hpp"

#include <memory>
#include <string>
#include <vector>

namespace im::scaleout {

/// Where the lab finds its config templates and binaries.
struct LabEnv {
    std::string config_dir;  // haproxy.cfg, patroni.yml, nats.conf templates
    std::string client_bin;  // im_scaleout_client
};

/// N gateways on fixed free loopback ports (so a restarted one comes back
/// where HAProxy expects it) and HAProxy in front.
class Fleet {
public:
    Fleet(const LabEnv& env, const std::string& db_url, const std::vector<std::string>& gateway_flags);
    ~Fleet();
    std::string ws_url() const; // through HAProxy
    unsigned short front_port() const { return front_; }
    /// HAProxy's view of gateway i (0-based): "UP", "DOWN", ...
    std::string status(std::size_t i) const;
    std::size_t size() const { return gws_.size(); }
    test::ServerProcess& gateway(std::size_t i) { return *gws_[i]; }
    std::string haproxy_cfg() const { return dir_.path() + "/haproxy.cfg"; }
    /// The gateways' warning and error log lines so far (they run --quiet,
    /// which keeps exactly those), the last `per_gateway` of each, for a
    /// failed scenario's report; empty when there are none.
    std::string warnings(std::size_t per_gateway = 20) const;

private:
    test::TempDir dir_;
    std::vector<unsigned short> ports_;
    std::vector<std::unique_ptr<test::ServerProcess>> gws_;
    unsigned short front_ = 0, stats_ = 0;
    std::unique_ptr<Proc> haproxy_;
};

/// One SDK client process (tests/scaleout/client.cpp) and what it printed.
struct ClientRun {
    std::string user, conv, prefix, out;
    std::unique_ptr<Proc> proc;
};

struct ClientFacts {
    std::map<std::string, std::string> sent;           // cmid -> body
    std::map<std::string, std::int64_t> acked;         // cmid -> seq
    std::vector<std::string> failed, gateways;
    std::map<std::string, long> retries;               // retryable error -> failed attempts
    bool drained = false;
    std::optional<std::string> converged;              // "n maxseq digest"
};
ClientFacts facts_of(const ClientRun& c);

class Clients {
public:
    /// One client per user of every world, each sending every interval_ms.
    Clients(const LabEnv& env, const std::string& ws_url, const std::vector<test::World>& worlds, int interval_ms);
    ~Clients();
    std::size_t total_acked() const;
    /// Waits until every client has at least n acknowledged sends.
    void wait_each_acked(std::size_t n, std::chrono::milliseconds timeout) const;
    /// Stops sending, waits for every outbox to drain, then for every client
    /// to sync its conversation to the server's head.
    void stop_and_converge(std::chrono::milliseconds timeout);
    const std::vector<ClientRun>& runs() const { return runs_; }
    /// One line per client: counts so far and the tail of its stderr.
    std::string describe() const;

private:
    void wait_all(const std::function<bool()>& pred, std::chrono::milliseconds timeout, const std::string& what) const;
    test::TempDir dir_;
    std::string stop_file_;
    std::vector<ClientRun> runs_;
};

/// The outcome judged on the database rows.
struct Verdict {
    long sent = 0, acked = 0, lost = 0, doubled = 0, unacked = 0, failed = 0, gaps = 0, diverged = 0, stray = 0,
         reconnects = 0;
    std::map<std::string, long> retries; // every client's failed attempts, by retryable error
    std::vector<std::string> problems;
    bool ok() const { return problems.empty(); }
    std::string summary() const;
};
/// Every acknowledged send is stored once at its acknowledged seq; no body
/// is stored twice; every conversation's seqs are 1..head without a gap;
/// every client's local copy equals the server's rows.
Verdict verify(const std::string& db_url, const Clients& clients);

} // namespace im::scaleout
