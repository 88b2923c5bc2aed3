// libFuzzer target: the SDK's frame decoder (sdk/src/codec.cpp), which every
// frame from the server goes through. Besides crashes and sanitizer reports
// it checks the decoder's promise: a frame it rejects always says why.
#include "codec_p.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const QByteArray frame(reinterpret_cast<const char*>(data), static_cast<qsizetype>(size));
    QString error, rid;
    auto in = im::proto::decode(frame, &error, &rid);
    if (!in && error.isEmpty()) std::abort();
    return 0;
}
