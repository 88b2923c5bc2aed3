// Role-name access shared by the list models: get(row) as a map keyed by
// role name and get(row, "name"), for QML and scripts (roleNames() is the
// single source of the names).
#pragma once

#include <QtCore/QAbstractItemModel>
#include <QtCore/QVariantMap>

namespace im::detail {

/// Every named role of `row`, keyed by its role name (empty if no such row).
inline QVariantMap rowByRoleName(const QAbstractItemModel *model, int row) {
    QVariantMap out;
    const QModelIndex index = model->index(row, 0);
    if (!index.isValid())
        return out;
    const QHash<int, QByteArray> names = model->roleNames();
    for (auto it = names.cbegin(); it != names.cend(); ++it)
        out.insert(QString::fromUtf8(it.value()), model->data(index, it.key()));
    return out;
}

/// The value of the role called `roleName` at `row`; invalid for an unknown
/// name or row.
inline QVariant valueByRoleName(const QAbstractItemModel *model, int row, const QString &roleName) {
    const QByteArray name = roleName.toUtf8();
    const QHash<int, QByteArray> names = model->roleNames();
    for (auto it = names.cbegin(); it != names.cend(); ++it)
        if (it.value() == name)
            return model->data(model->index(row, 0), it.key());
    return {};
}

} // namespace im::detail
