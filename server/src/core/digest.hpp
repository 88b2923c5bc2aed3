// SHA-256 as lowercase hex: device token hashes (store.cpp) and the
// checksums of schema files (migrations.cpp).
#pragma once

#include <string>
#include <string_view>

namespace im {

std::string sha256_hex(std::string_view data);

} // namespace im
