#include "procs.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <filesystem>
#include <mutex>
#include <vector>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace im::scaleout {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

void render(const std::string& template_path, const std::string& out, const std::map<std::string, std::string>& vars) {
    std::ifstream in(template_path);
    if (!in) throw std::runtime_error("cannot read " + template_path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    for (const auto& [k, v] : vars) {
        const std::string key = "@" + k + "@";
        for (auto p = text.find(key); p != std::string::npos; p = text.find(key, p + v.size()))
            text.replace(p, key.size(), v);
    }
    if (auto p = text.find('@'); p != std::string::npos && text.find('@', p + 1) != std::string::npos) {
        auto end = text.find('@', p + 1);
        auto name = text.substr(p + 1, end - p - 1);
        if (!name.empty() && name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789") == std::string::npos)
            throw std::runtime_error(template_path + ": no value for @" + name + "@");
    }
    std::ofstream o(out, std::ios::trunc);
    o << text;
    if (!o) throw std::runtime_error("cannot write " + out);
}

std::optional<std::pair<int, std::string>> http_get(unsigned short port, const std::string& target,
                                                    std::chrono::milliseconds timeout) {
    try {
        net::io_context ioc;
        beast::tcp_stream s(ioc);
        s.expires_after(timeout);
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
        http::request<http::empty_body> req{http::verb::get, target, 11};
        req.set(http::field::host, "127.0.0.1");
        http::write(s, req);
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        http::read(s, buf, res);
        beast::error_code ec;
        s.socket().shutdown(tcp::socket::shutdown_both, ec);
        return std::make_pair(static_cast<int>(res.result_int()), res.body());
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

bool drop_to_postgres() { return ::geteuid() == 0; }

void give_to_postgres(const std::string& path) {
    if (!drop_to_postgres()) return;
    struct passwd* pw = ::getpwnam("postgres");
    if (!pw) throw std::runtime_error("running as root needs the 'postgres' system user");
    namespace fs = std::filesystem;
    if (::chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) throw std::runtime_error("chown failed: " + path);
    if (fs::is_directory(path))
        for (const auto& e : fs::recursive_directory_iterator(path))
            if (::lchown(e.path().c_str(), pw->pw_uid, pw->pw_gid) != 0)
                throw std::runtime_error("chown failed: " + e.path().string());
}

Proc::Proc(std::vector<std::string> argv, std::string log_path, bool as_postgres, const std::string& stdout_path)
    : log_(std::move(log_path)) {
    uid_t uid = 0;
    gid_t gid = 0;
    bool drop = as_postgres && drop_to_postgres();
    if (drop) {
        struct passwd* pw = ::getpwnam("postgres");
        if (!pw) throw std::runtime_error("running as root needs the 'postgres' system user");
        uid = pw->pw_uid;
        gid = pw->pw_gid;
    }
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
        ::setpgid(0, 0);
        int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::close(fd);
        }
        if (!stdout_path.empty()) {
            int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (out >= 0) {
                ::dup2(out, 1);
                ::close(out);
            }
        }
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        if (drop) {
            if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(126);
            ::setenv("HOME", "/tmp", 1);
        }
        // After the credential change, which clears it: never outlive the lab.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        std::vector<char*> a;
        for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        ::execvp(a[0], a.data());
        ::_exit(127);
    }
    ::setpgid(pid_, pid_);
}

Proc::~Proc() { kill(); }

bool Proc::running() {
    if (pid_ <= 0) return false;
    return !wait_exit(0ms).has_value();
}

void Proc::signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> Proc::wait_exit(std::chrono::milliseconds wait) {
    if (pid_ <= 0) return std::nullopt;
    auto deadline = Clock::now() + wait;
    for (;;) {
        int st = 0;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (Clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(10ms);
    }
}

void Proc::kill() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
}

std::string Proc::log_tail(std::size_t n) const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return s.size() > n ? s.substr(s.size() - n) : s;
}

std::vector<std::string> read_lines(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line))
        if (!f.eof()) out.push_back(line); // a line without its newline is still being written
    return out;
}

} // namespace im::scaleout
