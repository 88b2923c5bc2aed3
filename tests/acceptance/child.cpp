#include "child.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace im::lab {

Child::Child(const std::vector<std::string>& argv) {
    char tmpl[] = "/tmp/imlab-child-XXXXXX";
    int efd = ::mkstemp(tmpl);
    if (efd < 0) throw std::runtime_error("mkstemp failed");
    err_path_ = tmpl;
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
        // Never outlive the lab (ctest's timeout SIGKILLs it, no destructor runs).
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        ::dup2(p[1], 1);
        ::dup2(efd, 2);
        ::close(p[0]);
        ::close(p[1]);
        std::vector<char*> a;
        for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        ::execv(a[0], a.data());
        ::_exit(127);
    }
    ::close(efd);
    ::close(p[1]);
    fd_ = p[0];
}

Child::~Child() {
    if (pid_ > 0) kill9();
    if (fd_ >= 0) ::close(fd_);
    ::unlink(err_path_.c_str());
}

std::optional<std::string> Child::line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto nl = buf_.find('\n');
        if (nl != std::string::npos) {
            std::string l = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            transcript_ += l + "\n";
            return l;
        }
        if (eof_) return std::nullopt;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return std::nullopt;
        pollfd pfd{fd_, POLLIN, 0};
        if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
        char tmp[4096];
        ssize_t n = ::read(fd_, tmp, sizeof tmp);
        if (n <= 0) eof_ = true;
        else buf_.append(tmp, static_cast<std::size_t>(n));
    }
}

std::optional<std::string> Child::until(const std::string& prefix, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return std::nullopt;
        auto l = line(left);
        if (!l) return std::nullopt;
        if (l->rfind(prefix, 0) == 0) return l;
    }
}

void Child::kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
}

std::optional<int> Child::wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
        int st = 0;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
}

std::string Child::stderr_text() const {
    std::ifstream f(err_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return s.size() > 600 ? s.substr(s.size() - 600) : s;
}

} // namespace im::lab
