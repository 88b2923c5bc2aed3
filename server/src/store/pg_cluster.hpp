// A private PostgreSQL cluster run from the Debian binaries: the server's
// embedded default and the test suites' throwaway database. It listens on a
// Unix socket only. Run as root, PostgreSQL itself runs as `postgres`.
#pragma once

#include <string>
#include <vector>

namespace im {

class PgCluster {
public:
    /// `root` is the folder that holds (or will hold) data/, run/ and log.
    explicit PgCluster(std::string root);

    /// initdb on first use. `fast`: fsync off (throwaway test clusters;
    /// commits still survive a server crash, just not a power cut), and a
    /// copy of a template initdb'd once per machine instead of an initdb
    /// each time (IM_PG_NO_TEMPLATE=1 turns that off).
    void ensure_initialized(bool fast = false);
    /// Starts the cluster unless it is running already; returns true if
    /// this call started it (and so should stop it).
    bool start();
    /// mode: "fast" (clean) or "immediate" (like a crash).
    void stop(const std::string& mode = "fast");
    bool running() const;
    /// Creates the database if missing.
    void ensure_database(const std::string& db = "im");
    /// A libpq connection string for `db`.
    std::string url(const std::string& db = "im") const;
    const std::string& root() const { return root_; }
    std::string socket_dir() const { return root_ + "/run"; }

    static std::string bin_dir(); // newest /usr/lib/postgresql/N/bin

private:
    int run_tool(const std::vector<std::string>& argv, bool quiet = true) const;
    void initdb(const std::string& data, bool no_sync) const;
    std::string template_data() const;
    std::string root_;
};

/// The folder for a state directory's cluster: STATE/pg, or, when PostgreSQL
/// could not reach that path (running as root under a private folder) or the
/// socket path would be too long, a folder under /tmp linked from STATE/pg.
std::string cluster_root_for_state_dir(const std::string& state_dir);

/// Removes a state directory's cluster folder when it lives outside it.
void remove_cluster_for_state_dir(const std::string& state_dir);

} // namespace im
