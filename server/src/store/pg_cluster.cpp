#include "store/pg_cluster.hpp"

#include "core/log.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace im {

namespace {

constexpr const char* db_user = "im";
constexpr int port = 5432; // only names the socket file in our private run/ folder

struct PgAccount {
    bool drop = false; // true when we are root and must run PostgreSQL as postgres
    uid_t uid = 0;
    gid_t gid = 0;
};

PgAccount pg_account() {
    PgAccount a;
    if (::geteuid() != 0) return a;
    struct passwd* pw = ::getpwnam("postgres");
    if (!pw) throw std::runtime_error("running as root needs the 'postgres' system user (apt-get install postgresql)");
    a.drop = true;
    a.uid = pw->pw_uid;
    a.gid = pw->pw_gid;
    return a;
}

// Runs argv, as `postgres` when we are root. Returns the exit status.
int spawn(const std::vector<std::string>& argv, const std::string& out_file) {
    PgAccount acct = pg_account();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        if (!out_file.empty()) {
            int fd = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                ::dup2(fd, 1);
                ::dup2(fd, 2);
                ::close(fd);
            }
        }
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        ::signal(SIGPIPE, SIG_DFL); // imserver ignores it (main.cpp); an ignored signal survives exec
        if (acct.drop) {
            if (::setgroups(0, nullptr) != 0 || ::setgid(acct.gid) != 0 || ::setuid(acct.uid) != 0) ::_exit(126);
        }
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execv(args[0], args.data());
        ::_exit(127);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// Can the postgres account reach (search) this directory? Checked in a child.
bool pg_can_reach(const std::string& dir) {
    PgAccount acct = pg_account();
    if (!acct.drop) return true;
    pid_t pid = ::fork();
    if (pid == 0) {
        if (::setgroups(0, nullptr) != 0 || ::setgid(acct.gid) != 0 || ::setuid(acct.uid) != 0) ::_exit(2);
        ::_exit(::access(dir.c_str(), X_OK) == 0 ? 0 : 1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void chown_tree(const std::string& path) {
    PgAccount acct = pg_account();
    if (!acct.drop) return;
    if (::chown(path.c_str(), acct.uid, acct.gid) != 0) throw std::runtime_error("chown failed: " + path);
}

// A fresh private folder under /tmp (mkdtemp: a new directory, mode 0700,
// never an existing path or a symlink someone planted).
std::string make_external_root() {
    char tmpl[] = "/tmp/imserver-pg-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp failed: ") + std::strerror(errno));
    return tmpl;
}

// May the cluster live in `dir`? Only a real directory (not a symlink),
// owned by us or the PostgreSQL account, that nobody else can write to.
bool safe_cluster_dir(const std::string& dir) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    PgAccount acct = pg_account();
    bool owner_ok = st.st_uid == ::geteuid() || (acct.drop && st.st_uid == acct.uid);
    return owner_ok && (st.st_mode & 0022) == 0;
}

} // namespace

std::string cluster_root_for_state_dir(const std::string& state_dir) {
    fs::create_directories(state_dir);
    fs::path link = fs::path(state_dir) / "pg";
    if (fs::is_symlink(link)) {
        fs::path target = fs::read_symlink(link);
        if (safe_cluster_dir(target.string())) return target.string();
        struct stat st {};
        if (::lstat(target.c_str(), &st) == 0)
            throw std::runtime_error("refusing cluster folder " + target.string() +
                                     ": not a private directory of ours (a symlink, or writable by others)");
        // Gone (a reboot cleaned /tmp): a new private folder, never the old path.
        fs::remove(link);
        std::string fresh = make_external_root();
        fs::create_symlink(fresh, link);
        return fresh;
    }
    if (fs::exists(link)) return fs::canonical(link).string();
    std::string inside = fs::absolute(link).lexically_normal().string();
    bool too_long = inside.size() + std::string("/run/.s.PGSQL.5432.lock").size() > 100;
    if (!too_long && pg_can_reach(fs::absolute(state_dir).string())) {
        fs::create_directories(inside);
        return inside;
    }
    std::string outside = make_external_root();
    fs::create_symlink(outside, link);
    log_info("pg_cluster_outside_state_dir", {{"state_dir", state_dir}, {"cluster", outside}});
    return outside;
}

void remove_cluster_for_state_dir(const std::string& state_dir) {
    fs::path link = fs::path(state_dir) / "pg";
    std::error_code ec;
    if (fs::is_symlink(link, ec)) {
        auto target = fs::read_symlink(link, ec);
        if (!ec) fs::remove_all(target, ec);
    }
}

PgCluster::PgCluster(std::string root) : root_(fs::absolute(root).lexically_normal().string()) {}

std::string PgCluster::bin_dir() {
    if (const char* env = std::getenv("IM_PG_BIN"); env && *env) return env;
    std::string best;
    int best_ver = -1;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
        int v = std::atoi(e.path().filename().c_str());
        if (v > best_ver && fs::exists(e.path() / "bin" / "pg_ctl")) {
            best_ver = v;
            best = (e.path() / "bin").string();
        }
    }
    if (best.empty())
        throw std::runtime_error("no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)");
    return best;
}

int PgCluster::run_tool(const std::vector<std::string>& argv, bool quiet) const {
    return spawn(argv, quiet ? root_ + "/tools.log" : "");
}

void PgCluster::initdb(const std::string& data, bool no_sync) const {
    std::vector<std::string> argv = {bin_dir() + "/initdb", "-D", data, "-U", db_user, "--auth=trust",
                                     "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions"};
    if (no_sync) argv.push_back("--no-sync");
    int rc = run_tool(argv);
    if (rc != 0) {
        // Some minimal systems lack C.UTF-8; plain C with UTF8 encoding works anywhere.
        fs::remove_all(data);
        argv[6] = "--locale=C";
        rc = run_tool(argv);
    }
    if (rc != 0) throw std::runtime_error("initdb failed; see " + root_ + "/tools.log");
}

// Throwaway (fast) clusters start as a copy of one initdb'd template per
// machine user and PostgreSQL version: an initdb costs 1-2 s of CPU, a copy
// a tenth of that, and a test run makes dozens. The template is built once
// under a lock (tests run in parallel) and never started itself.
std::string PgCluster::template_data() const {
    const std::string bin = bin_dir();
    const std::string ver = fs::path(bin).parent_path().filename().string();
    const std::string dir = "/tmp/imserver-pg-template-" + std::to_string(::geteuid()) + "-" + ver;
    int lock = ::open((dir + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock < 0) throw std::runtime_error("cannot open " + dir + ".lock: " + std::strerror(errno));
    struct Unlock {
        int fd;
        ~Unlock() { ::close(fd); } // closing drops the flock
    } unlock{lock};
    while (::flock(lock, LOCK_EX) != 0 && errno == EINTR) {
    }
    if (!fs::exists(dir)) {
        fs::create_directory(dir);
        ::chmod(dir.c_str(), 0700);
        chown_tree(dir);
    }
    if (!safe_cluster_dir(dir)) throw std::runtime_error("refusing template folder " + dir + ": not private to us");
    if (!fs::exists(dir + "/data/PG_VERSION")) {
        fs::remove_all(dir + "/data");
        PgCluster(dir).initdb(dir + "/data", /*no_sync=*/true);
    }
    return dir + "/data";
}

void PgCluster::ensure_initialized(bool fast) {
    fs::create_directories(root_);
    chown_tree(root_);
    ::chmod(root_.c_str(), 0700);
    if (fs::exists(root_ + "/data/PG_VERSION")) return;
    fs::create_directories(root_ + "/run");
    chown_tree(root_ + "/run");
    const char* no_template = std::getenv("IM_PG_NO_TEMPLATE");
    if (fast && !(no_template && *no_template)) {
        if (run_tool({"/bin/cp", "-a", template_data(), root_ + "/data"}) != 0)
            throw std::runtime_error("copying the template cluster failed; see " + root_ + "/tools.log");
    } else {
        initdb(root_ + "/data", fast);
    }
    std::ofstream conf(root_ + "/data/postgresql.conf", std::ios::app);
    conf << "\n# written by imserver: private cluster on a Unix socket only\n"
         << "listen_addresses = ''\n"
         << "unix_socket_directories = '" << root_ << "/run'\n"
         << "port = " << port << "\n"
         << "max_connections = 200\n";
    if (fast) conf << "fsync = off\nfull_page_writes = off\n";
}

bool PgCluster::running() const {
    return spawn({bin_dir() + "/pg_ctl", "status", "-D", root_ + "/data"}, "/dev/null") == 0;
}

bool PgCluster::start() {
    if (running()) return false;
    fs::create_directories(root_ + "/run");
    chown_tree(root_ + "/run");
    int rc = run_tool({bin_dir() + "/pg_ctl", "start", "-w", "-t", "60", "-D", root_ + "/data", "-l",
                       root_ + "/postgres.log"});
    if (rc != 0) throw std::runtime_error("pg_ctl start failed; see " + root_ + "/postgres.log");
    return true;
}

void PgCluster::stop(const std::string& mode) {
    run_tool({bin_dir() + "/pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", root_ + "/data"});
}

std::string PgCluster::url(const std::string& db) const {
    return "host=" + root_ + "/run port=" + std::to_string(port) + " user=" + db_user + " dbname=" + db;
}

void PgCluster::ensure_database(const std::string& db) {
    pqxx::connection c(url("postgres"));
    pqxx::nontransaction tx(c);
    if (tx.exec_params("SELECT 1 FROM pg_database WHERE datname = $1", db).empty())
        tx.exec("CREATE DATABASE " + tx.quote_name(db));
}

} // namespace im
