#include "patroni.hpp"

#include "store/pg_cluster.hpp"

#include <pqxx/pqxx>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace im::scaleout {

namespace fs = std::filesystem;

PatroniCluster::PatroniCluster(const std::string& config_dir) : dir_("imha"), config_dir_(config_dir) {
    scope_ = test::unique_name("im-lab");
    etcd_client_ = free_port();
    etcd_peer_ = free_port();
    const std::string client = "http://127.0.0.1:" + std::to_string(etcd_client_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(etcd_peer_);
    etcd_ = std::make_unique<Proc>(
        std::vector<std::string>{"etcd", "--name", "e1", "--data-dir", dir_.path() + "/etcd", "--listen-client-urls",
                                 client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                 "--initial-advertise-peer-urls", peer, "--initial-cluster", "e1=" + peer,
                                 "--initial-cluster-state", "new", "--log-level", "warn"},
        dir_.path() + "/etcd.log");
    wait_until(
        [&] {
            auto r = http_get(etcd_client_, "/health");
            return r && r->first == 200 && r->second.find("true") != std::string::npos;
        },
        60s, "etcd to be healthy");

    for (const char* name : {"pg1", "pg2"}) {
        Node n;
        n.name = name;
        n.dir = dir_.path() + "/" + name;
        n.pg_port = free_port();
        n.rest_port = free_port();
        nodes_.push_back(std::move(n));
    }
    // The first node bootstraps and becomes primary; the second clones it.
    start_node(nodes_[0], config_dir);
    try {
        wait_until([&] { return primary() == std::optional<std::size_t>(0); }, 120s, "pg1 to become primary");
        {
            pqxx::connection c(node_url(0, "postgres"));
            pqxx::nontransaction tx(c);
            tx.exec("CREATE DATABASE im");
        }
        start_node(nodes_[1], config_dir);
        wait_until([&] { return has_sync_standby(); }, 120s, "pg2 to stream as the synchronous standby");
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string(e.what()) + "\npg1:\n" + log_tail(0) + "\npg2:\n" + log_tail(1));
    }
}

PatroniCluster::~PatroniCluster() {
    for (auto& n : nodes_) {
        if (n.patroni) n.patroni->kill();
        kill_postgres(n);
    }
    etcd_.reset();
}

void PatroniCluster::start_node(Node& n, const std::string& config_dir) {
    fs::create_directories(n.dir);
    ::chmod(n.dir.c_str(), 0700);
    render(config_dir + "/patroni.yml", patroni_yml(static_cast<std::size_t>(&n - nodes_.data())),
           {{"SCOPE", scope_},
            {"NAME", n.name},
            {"REST_PORT", std::to_string(n.rest_port)},
            {"ETCD_PORT", std::to_string(etcd_client_)},
            {"PG_PORT", std::to_string(n.pg_port)},
            {"DIR", n.dir},
            {"PG_BIN", PgCluster::bin_dir()}});
    give_to_postgres(n.dir);
    n.patroni = std::make_unique<Proc>(std::vector<std::string>{"patroni", n.dir + "/patroni.yml"},
                                       n.dir + "/patroni.log", /*as_postgres=*/true);
}

std::string PatroniCluster::patroni_yml(std::size_t i) const { return nodes_[i].dir + "/patroni.yml"; }

std::string PatroniCluster::url() const {
    std::string hosts;
    for (const auto& n : nodes_) hosts += (hosts.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(n.pg_port);
    return "postgresql://im@" + hosts + "/im?target_session_attrs=read-write&connect_timeout=2";
}

std::string PatroniCluster::node_url(std::size_t i, const std::string& db) const {
    return "host=127.0.0.1 port=" + std::to_string(nodes_[i].pg_port) + " user=im dbname=" + db +
           " connect_timeout=2";
}

std::optional<std::size_t> PatroniCluster::primary() const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i].patroni) continue;
        try {
            pqxx::connection c(node_url(i, "postgres"));
            pqxx::nontransaction tx(c);
            if (!tx.exec("SELECT pg_is_in_recovery()")[0][0].as<bool>()) return i;
        } catch (const std::exception&) {
        }
    }
    return std::nullopt;
}

bool PatroniCluster::has_sync_standby() const {
    auto p = primary();
    if (!p) return false;
    try {
        pqxx::connection c(node_url(*p, "postgres"));
        pqxx::nontransaction tx(c);
        return tx.exec("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'")[0][0]
                   .as<int>() > 0;
    } catch (const std::exception&) {
        return false;
    }
}

bool PatroniCluster::is_sync_standby(std::size_t i) const {
    if (!nodes_[i].patroni) return false;
    auto r = http_get(nodes_[i].rest_port, "/sync");
    return r && r->first == 200;
}

void PatroniCluster::kill_postgres(const Node& n) {
    // Patroni starts the postmaster in a session of its own: find it by the
    // pid file of this node's data directory and kill its process group.
    // Only a process whose command line names this data directory is ours.
    std::ifstream f(n.dir + "/data/postmaster.pid");
    long pid = 0;
    if (!(f >> pid) || pid <= 1) return;
    std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find(n.dir + "/data") == std::string::npos) return;
    pid_t pgid = ::getpgid(static_cast<pid_t>(pid));
    if (pgid > 1 && pgid != ::getpgrp()) ::kill(-pgid, SIGKILL);
    ::kill(static_cast<pid_t>(pid), SIGKILL);
}

void PatroniCluster::kill_node(std::size_t i) {
    auto& n = nodes_[i];
    if (n.patroni) n.patroni->kill(); // first, so it cannot start PostgreSQL again
    kill_postgres(n);
    n.patroni.reset();
}

void PatroniCluster::restart_node(std::size_t i) {
    if (!nodes_[i].patroni) start_node(nodes_[i], config_dir_);
}

std::string PatroniCluster::log_tail(std::size_t i) const {
    return i < nodes_.size() && nodes_[i].patroni ? nodes_[i].patroni->log_tail() : std::string();
}

} // namespace im::scaleout
