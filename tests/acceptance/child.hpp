// A child process whose stdout the lab reads line by line (the SDK child).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace im::lab {

class Child {
public:
    explicit Child(const std::vector<std::string>& argv);
    ~Child();
    Child(const Child&) = delete;
    /// Next stdout line, or nothing on EOF / timeout.
    std::optional<std::string> line(std::chrono::milliseconds timeout);
    /// Reads lines until one starts with prefix; returns it (nothing on EOF / timeout).
    std::optional<std::string> until(const std::string& prefix, std::chrono::milliseconds timeout);
    void kill9();                       // SIGKILL and reap
    std::optional<int> wait(std::chrono::milliseconds timeout);
    std::string transcript() const { return transcript_; } // every line read so far
    std::string stderr_text() const;

private:
    pid_t pid_ = -1;
    int fd_ = -1;
    std::string buf_, transcript_, err_path_;
    bool eof_ = false;
};

} // namespace im::lab
