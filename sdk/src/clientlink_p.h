// The models' link to their Client, which can be set or changed after
// construction (from QML): the client pointer and the connections made to it.
#pragma once

#include <im/client.h>

#include <QtCore/QList>
#include <QtCore/QObject>
#include <QtCore/QPointer>

namespace im::detail {

/// Drops the connections to the old client and takes `next`. False when
/// nothing changes (the same client, already linked).
inline bool relink(QPointer<Client> &client, QList<QMetaObject::Connection> &links, Client *next) {
    if (next == client && (next || links.isEmpty()))
        return false;
    for (const QMetaObject::Connection &l : std::as_const(links))
        QObject::disconnect(l);
    links.clear();
    client = next;
    return true;
}

} // namespace im::detail
