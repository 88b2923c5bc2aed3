#include "shared_p.h"

#include <QtCore/QRandomGenerator>

#include <algorithm>

namespace im::detail {

int Backoff::delayMs(int attempt) const {
    const int exp = std::clamp(attempt - 1, 0, 20);
    const qint64 d = std::min<qint64>(maxMs, qint64(initialMs) << exp);
    return int(d / 2 + QRandomGenerator::global()->bounded(d / 2 + 1));
}

} // namespace im::detail
