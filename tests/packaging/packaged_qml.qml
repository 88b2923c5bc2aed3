// Run by deb_test.sh with qmltestrunner against the unpacked
// qml6-module-imsdk and the packaged imserver (it fills in @URL@, @TOKEN@
// and @DB@): import ImSdk from the package, send, see the message Sent.
import QtQuick
import QtTest
import ImSdk

TestCase {
    name: "PackagedImSdk"

    Client { id: client }
    MessageListModel { id: msgs; client: client; conversation: "team" }

    function test_send() {
        verify(client.open("@DB@"), client.lastError())
        client.setServers(["@URL@"])
        client.setCredentials("@TOKEN@")
        client.connectToServer()
        tryCompare(client, "connectionState", Im.Connected, 60000)
        const cmid = client.send("team", "sent through the packaged QML module")
        verify(cmid !== "", client.lastError())
        tryVerify(() => client.messageState(cmid) === Im.MessageState.Sent, 60000, "never Sent")
        tryVerify(() => {
            for (let r = 0; r < msgs.count; ++r)
                if (msgs.get(r, "cmid") === cmid)
                    return msgs.get(r).seq > 0
            return false
        }, 60000, "no row with a seq")
        client.disconnectFromServer()
        client.close()
    }
}
