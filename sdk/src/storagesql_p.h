// Helpers shared by the storage_*.cpp files (the SQL of one table family each).
#pragma once

#include <QtCore/QMetaType>
#include <QtCore/QString>
#include <QtCore/QVariant>

namespace im::detail {

/// A NULL for a null string, else the string (bind values).
inline QVariant nullIfEmpty(const QString &s) {
    return s.isNull() ? QVariant(QMetaType(QMetaType::QString)) : QVariant(s);
}

} // namespace im::detail
