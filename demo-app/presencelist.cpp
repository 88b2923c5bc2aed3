#include "presencelist.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/presencewatch.h>

#include <QtCore/QDateTime>
#include <QtCore/QLocale>
#include <QtCore/QTimer>
#include <QtGui/QBrush>
#include <QtGui/QColor>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QListWidget>
#include <QtWidgets/QVBoxLayout>

PresenceList::PresenceList(im::ConversationListModel *convs, QWidget *parent) : QWidget(parent), convs_(convs) {
    setObjectName(QStringLiteral("presencePanel"));
    list_ = new QListWidget;
    list_->setObjectName(QStringLiteral("presenceList"));
    list_->setToolTip(tr("im::PresenceWatch: green dot online, grey dot offline with the last time seen; "
                         "users who share no conversation with you stay unknown (the server leaves them out)"));
    list_->setMaximumHeight(110);
    addEdit_ = new QLineEdit;
    addEdit_->setObjectName(QStringLiteral("watchUserEdit"));
    addEdit_->setPlaceholderText(tr("Watch user id, Enter"));
    connect(addEdit_, &QLineEdit::returnPressed, this, [this] {
        addUser(addEdit_->text().trimmed());
        addEdit_->clear();
    });
    auto *l = new QVBoxLayout(this);
    l->setContentsMargins(0, 0, 0, 0);
    l->addWidget(new QLabel(tr("People")));
    l->addWidget(list_);
    l->addWidget(addEdit_);

    if (im::Client *client = convs_->client()) {
        watch_ = new im::PresenceWatch(client, {}, this);
        connect(watch_, &im::PresenceWatch::presenceChanged, this, &PresenceList::updateRows);
        connect(client, &im::Client::identityChanged, this, &PresenceList::updateUsers);
    }
    connect(convs_, &QAbstractItemModel::rowsInserted, this, &PresenceList::updateUsers);
    connect(convs_, &QAbstractItemModel::rowsRemoved, this, &PresenceList::updateUsers);
    connect(convs_, &QAbstractItemModel::modelReset, this, &PresenceList::updateUsers);
    // "3 min ago" moves on.
    auto *tick = new QTimer(this);
    tick->setInterval(30000);
    connect(tick, &QTimer::timeout, this, &PresenceList::updateRows);
    tick->start();
    updateUsers();
}

QString PresenceList::directPeer(const QString &conv, const QString &me) {
    const QStringList parts = conv.split(QLatin1Char('-'));
    if (me.isEmpty() || parts.size() != 2 || parts[0] == parts[1])
        return {};
    if (parts[0] == me)
        return parts[1];
    if (parts[1] == me)
        return parts[0];
    return {};
}

QStringList PresenceList::users() const { return watch_ ? watch_->users() : QStringList(); }

void PresenceList::addUser(const QString &user) {
    if (user.isEmpty() || added_.contains(user))
        return;
    added_.append(user);
    updateUsers();
}

void PresenceList::updateUsers() {
    if (!watch_)
        return;
    const QString me = convs_->client() ? convs_->client()->userId() : QString();
    QStringList users;
    for (int r = 0; r < convs_->count(); ++r) {
        if (convs_->get(r, im::ConversationListModel::KindRole).toString() != u"direct")
            continue;
        const QString peer = directPeer(convs_->get(r, im::ConversationListModel::ConvRole).toString(), me);
        if (!peer.isEmpty() && !users.contains(peer))
            users.append(peer);
    }
    users.sort();
    for (const QString &u : std::as_const(added_))
        if (!users.contains(u))
            users.append(u);
    watch_->setUsers(users);
    updateRows();
}

QString PresenceList::statusText(bool known, bool online, const QDateTime &lastSeen) {
    if (!known)
        return tr("unknown (no shared conversation?)");
    if (online)
        return tr("online");
    if (!lastSeen.isValid())
        return tr("last seen: never");
    const qint64 mins = lastSeen.secsTo(QDateTime::currentDateTime()) / 60;
    const QString ago = mins < 1 ? tr("just now") : mins < 60 ? tr("%1 min ago").arg(mins) : tr("%1 h ago").arg(mins / 60);
    return tr("last seen %1 (%2)").arg(QLocale().toString(lastSeen.time(), QLocale::ShortFormat), ago);
}

void PresenceList::updateRows() {
    const QStringList users = this->users();
    list_->clear();
    for (const QString &u : users) {
        const bool known = watch_->isKnown(u);
        const bool online = watch_->isOnline(u);
        auto *item = new QListWidgetItem(QStringLiteral("%1 %2 — %3")
                                             .arg(known ? QStringLiteral("●") : QStringLiteral("○"), u,
                                                  statusText(known, online, watch_->lastSeenOf(u))));
        item->setForeground(online ? QBrush(QColor(0x1f, 0x9d, 0x55)) : QBrush(Qt::gray));
        item->setData(UserRole, u);
        item->setData(OnlineRole, online);
        item->setData(KnownRole, known);
        list_->addItem(item);
    }
}
