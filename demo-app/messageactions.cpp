#include "messageactions.h"

#include "messagepanel.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtGui/QAction>
#include <QtGui/QKeySequence>
#include <QtGui/QShortcut>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QMenu>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QVBoxLayout>

using im::MessageListModel;
using im::MessageState;

const QStringList &MessageActions::quickEmoji() {
    static const QStringList e{QStringLiteral("👍"), QStringLiteral("❤️"), QStringLiteral("😂"),
                               QStringLiteral("😮"), QStringLiteral("😢"), QStringLiteral("🎉")};
    return e;
}

const QStringList &MessageActions::manyEmoji() {
    static const QStringList e = [] {
        QStringList l;
        // 21 distinct fruit and vegetables (U+1F347 grapes ... U+1F35B), none of quickEmoji().
        for (char32_t c = 0x1F347; l.size() < 21; ++c)
            l << QString::fromUcs4(&c, 1);
        return l;
    }();
    return e;
}

MessageActions::MessageActions(im::Client *client, QLineEdit *sendEdit, QPushButton *sendButton, QWidget *parent)
    : QWidget(parent), client_(client), sendEdit_(sendEdit), sendButton_(sendButton) {
    setObjectName(QStringLiteral("messageActions"));
    composeBar_ = new QWidget;
    composeBar_->setObjectName(QStringLiteral("composeBar"));
    composeBar_->setStyleSheet(QStringLiteral("#composeBar { border-left: 3px solid #4a90d9; background: #eef4fb; }"));
    composeLabel_ = new QLabel;
    composeLabel_->setObjectName(QStringLiteral("composeLabel"));
    composeCancel_ = new QPushButton(tr("Cancel"));
    composeCancel_->setObjectName(QStringLiteral("composeCancelButton"));
    composeCancel_->setToolTip(tr("Back to sending a plain message (Escape)"));
    connect(composeCancel_, &QPushButton::clicked, this, &MessageActions::cancelCompose);
    auto *bar = new QHBoxLayout(composeBar_);
    bar->setContentsMargins(6, 2, 2, 2);
    bar->addWidget(composeLabel_, 1);
    bar->addWidget(composeCancel_);
    composeBar_->hide();
    auto *escape = new QShortcut(QKeySequence(Qt::Key_Escape), sendEdit_, nullptr, nullptr, Qt::WidgetShortcut);
    connect(escape, &QShortcut::activated, this, &MessageActions::cancelCompose);

    resultLabel_ = new QLabel;
    resultLabel_->setObjectName(QStringLiteral("changeResultLabel"));
    resultLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    resultLabel_->setToolTip(tr("The outcome of your last edit or reaction: Sent, or Failed with the server's code"));
    resultLabel_->hide();

    auto *l = new QVBoxLayout(this);
    l->setContentsMargins(0, 0, 0, 0);
    l->setSpacing(2);
    l->addWidget(resultLabel_);
    l->addWidget(composeBar_);

    connect(client_, &im::Client::messageStateChanged, this,
            [this](const QString &, const QString &cmid, qint64 seq, MessageState st, const QString &code) {
                if (st != MessageState::Pending && tracked_.contains(cmid))
                    settled(cmid, seq, st, code);
            });
}

MessageActions::Target MessageActions::targetOf(const QModelIndex &src, const QString &conv) {
    Target t;
    t.conv = conv;
    t.seq = src.data(MessageListModel::SeqRole).toLongLong();
    t.own = src.data(MessageListModel::IsOwnRole).toBool();
    t.cmid = t.own ? src.data(MessageListModel::CmidRole).toString() : QString();
    return t;
}

QString MessageActions::describe(const Target &t) {
    return t.seq > 0 ? QStringLiteral("seq %1").arg(t.seq) : QStringLiteral("cmid %1").arg(t.cmid.left(8));
}

void MessageActions::addToMenu(QMenu *menu, const QModelIndex &src, const QString &conv) {
    const Target t = targetOf(src, conv);
    const auto st = MessageState(src.data(MessageListModel::StateRole).toInt());
    const bool isMsg = src.data(MessageListModel::KindRole).toString() == QLatin1String("msg");
    const bool live = isMsg && st != MessageState::Recalled && st != MessageState::Failed
                      && st != MessageState::Expired;
    // A target: a seq, or our own message still in the outbox (by cmid).
    const bool addressable = live && (t.seq > 0 || (t.own && !t.cmid.isEmpty()));
    const QString body = src.data(MessageListModel::BodyRole).toString();
    const QString sender = src.data(MessageListModel::SenderRole).toString();

    menu->addSeparator();
    QAction *reply = menu->addAction(t.seq > 0 ? tr("Reply (to seq %1)").arg(t.seq) : tr("Reply"));
    reply->setObjectName(QStringLiteral("replyAction"));
    reply->setEnabled(live && t.seq > 0);
    connect(reply, &QAction::triggered, this, [this, t, sender, body] { startReply(t, sender, body); });

    QAction *edit = menu->addAction(t.seq > 0 ? tr("Edit (seq %1)").arg(t.seq) : tr("Edit"));
    edit->setObjectName(QStringLiteral("editAction"));
    // Others' messages stay editable on purpose: QA sees NOT_SENDER.
    edit->setEnabled(addressable);
    if (!t.own)
        edit->setText(edit->text() + tr(" - not yours: expect NOT_SENDER"));
    connect(edit, &QAction::triggered, this, [this, t, body] { startEdit(t, body); });

    QMenu *reactMenu = menu->addMenu(tr("React"));
    reactMenu->setObjectName(QStringLiteral("reactMenu"));
    reactMenu->setEnabled(addressable);
    QSet<QString> mine;
    for (const QVariant &v : src.data(MessageListModel::ReactionsRole).toList())
        if (v.toMap().value(QStringLiteral("mine")).toBool())
            mine.insert(v.toMap().value(QStringLiteral("emoji")).toString());
    const QPersistentModelIndex keep(src);
    for (int i = 0; i < quickEmoji().size(); ++i) {
        const QString emoji = quickEmoji().at(i);
        const bool on = mine.contains(emoji);
        QAction *a = reactMenu->addAction(on ? tr("%1 (yours: remove)").arg(emoji) : emoji);
        a->setObjectName(QStringLiteral("reactAction%1").arg(i));
        a->setCheckable(true);
        a->setChecked(on);
        connect(a, &QAction::triggered, this, [this, keep, conv, emoji, on] {
            if (keep.isValid())
                react(keep, conv, emoji, !on);
        });
    }
    reactMenu->addSeparator();
    QAction *many = reactMenu->addAction(tr("QA: react with 21 distinct emoji (expect INVALID_ARGUMENT)"));
    many->setObjectName(QStringLiteral("reactManyAction"));
    connect(many, &QAction::triggered, this, [this, keep, conv] {
        if (keep.isValid())
            reactMany(keep, conv);
    });
}

void MessageActions::startReply(const Target &t, const QString &sender, const QString &text) {
    mode_ = Mode::Reply;
    target_ = t;
    showCompose(tr("Replying to %1 (seq %2): %3").arg(sender).arg(t.seq).arg(text.section(QLatin1Char('\n'), 0, 0)));
    sendButton_->setText(tr("Reply"));
    sendEdit_->clear();
    sendEdit_->setFocus();
}

void MessageActions::startEdit(const Target &t, const QString &body) {
    mode_ = Mode::Edit;
    target_ = t;
    showCompose(t.own ? tr("Editing your message (%1)").arg(describe(t))
                      : tr("Editing someone else's message (%1): the server answers NOT_SENDER").arg(describe(t)));
    sendButton_->setText(tr("Save edit"));
    sendEdit_->setText(body);
    sendEdit_->selectAll();
    sendEdit_->setFocus();
}

void MessageActions::showCompose(const QString &text) {
    composeLabel_->setText(text);
    composeLabel_->setToolTip(text);
    composeBar_->show();
}

void MessageActions::cancelCompose() {
    const bool wasEdit = mode_ == Mode::Edit;
    mode_ = Mode::Send;
    target_ = {};
    composeBar_->hide();
    composeLabel_->clear();
    sendButton_->setText(tr("Send"));
    if (wasEdit)
        sendEdit_->clear();
}

QString MessageActions::submit(const QString &text) {
    QString cmid;
    QString what;
    if (mode_ == Mode::Reply) {
        cmid = client_->reply(target_.conv, target_.seq, text);
        what = tr("Reply to %1").arg(describe(target_));
    } else if (mode_ == Mode::Edit) {
        cmid = target_.seq > 0 ? client_->edit(target_.conv, target_.seq, text)
                               : client_->edit(target_.conv, target_.cmid, text);
        what = tr("Edit of %1").arg(describe(target_));
    } else {
        return {};
    }
    if (cmid.isEmpty()) {
        showResult(tr("%1 not queued: %2").arg(what, client_->lastError()));
        return {};
    }
    // An edit of our unsent message rewrites the message itself (its own cmid).
    if (mode_ == Mode::Edit && cmid != target_.cmid)
        track(cmid, what);
    else
        emit statusMessage(tr("%1 queued (request %2)").arg(what, cmid.left(8)), 5000);
    cancelCompose(); // clears the send box after an edit
    return cmid;
}

QString MessageActions::react(const QModelIndex &src, const QString &conv, const QString &emoji, bool on) {
    const Target t = targetOf(src, conv);
    const QString cmid = t.seq > 0 ? client_->react(conv, t.seq, emoji, on) : client_->react(conv, t.cmid, emoji, on);
    const QString what = (on ? tr("Reaction %1 on %2") : tr("Removing reaction %1 from %2")).arg(emoji, describe(t));
    if (cmid.isEmpty())
        showResult(tr("%1 not queued: %2").arg(what, client_->lastError()));
    else
        track(cmid, what);
    return cmid;
}

void MessageActions::reactMany(const QModelIndex &src, const QString &conv) {
    const Target t = targetOf(src, conv);
    const int id = nextBatch_++;
    Batch &b = batches_[id];
    b.what = tr("%1 distinct reactions on %2").arg(manyEmoji().size()).arg(describe(t));
    for (const QString &emoji : manyEmoji()) {
        const QString cmid = t.seq > 0 ? client_->react(conv, t.seq, emoji, true)
                                       : client_->react(conv, t.cmid, emoji, true);
        if (cmid.isEmpty()) {
            ++b.failed[QStringLiteral("not queued: ") + client_->lastError()];
            continue;
        }
        ++b.left;
        track(cmid, tr("Reaction %1 on %2").arg(emoji, describe(t)), id);
    }
    emit statusMessage(tr("%1 queued").arg(b.what), 5000);
}

void MessageActions::track(const QString &cmid, const QString &what, int batch) {
    tracked_.insert(cmid, {what, batch});
    if (!batch)
        emit statusMessage(tr("%1 queued (request %2)").arg(what, cmid.left(8)), 5000);
}

void MessageActions::settled(const QString &cmid, qint64 seq, MessageState state, const QString &code) {
    const auto [what, batch] = tracked_.take(cmid);
    QString text = tr("%1 (request %2): %3").arg(what, cmid.left(8), MessagePanel::stateText(state, code));
    if (state == MessageState::Sent)
        text += seq > 0 ? tr(", event seq %1").arg(seq) : tr(" (nothing to undo)");
    if (!batch || !batches_.contains(batch)) {
        showResult(text);
        return;
    }
    Batch &b = batches_[batch];
    if (state == MessageState::Sent)
        ++b.sent;
    else
        ++b.failed[code.isEmpty() ? MessagePanel::stateText(state, code) : code];
    if (state != MessageState::Sent)
        showResult(text); // each refusal with its code, as it comes
    if (--b.left > 0)
        return;
    QStringList failed;
    for (auto it = b.failed.cbegin(); it != b.failed.cend(); ++it)
        failed << tr("%1 Failed: %2").arg(it.value()).arg(it.key());
    showResult(tr("%1: %2 Sent%3").arg(b.what).arg(b.sent).arg(failed.isEmpty() ? QString()
                                                                                 : QStringLiteral(", ") + failed.join(QStringLiteral(", "))));
    batches_.remove(batch);
}

void MessageActions::showResult(const QString &text) {
    resultLabel_->setText(text);
    resultLabel_->setToolTip(text);
    resultLabel_->show();
    emit statusMessage(text, 15000);
}

QString MessageActions::lastResult() const { return resultLabel_->text(); }
