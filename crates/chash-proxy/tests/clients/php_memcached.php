<?php
// php-memcached (libmemcached) through the proxy, as a PHP application and
// its health checks use it: getVersion() and getStats() (libmemcached sends
// `version` before `stats` and gives up unless the version is a number),
// set/get/getMulti, delete.
//
// usage: php php_memcached.php HOST:PORT
[$host, $port] = explode(':', $argv[1]);
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, false);
$m->addServer($host, (int) $port);
$fail = function (string $what) use ($m) {
    fwrite(STDERR, "$what: " . $m->getResultMessage() . " (" . $m->getResultCode() . ")\n");
    exit(1);
};
// A PHP session in memcached (run with session.save_handler=memcached and
// memcached.sess_binary_protocol=0): stored by one request, read by the
// next. First, before any output (a session starts before headers go).
$session = '';
if (ini_get('session.save_handler') === 'memcached') {
    session_id('chashsessiontest');
    session_start();
    $_SESSION['visits'] = 42;
    session_write_close();
    $_SESSION = [];
    session_id('chashsessiontest');
    session_start();
    if (($_SESSION['visits'] ?? null) !== 42) {
        fwrite(STDERR, "session: " . var_export($_SESSION, true) . "\n");
        exit(1);
    }
    session_write_close();
    $session = "session: stored and read back\n";
}
$server = "$host:$port";
$versions = $m->getVersion();
if ($versions === false || !isset($versions[$server]) || !preg_match('/^1\.\d+\.\d+$/', $versions[$server])) {
    $fail('getVersion() ' . var_export($versions, true));
}
echo "getVersion(): {$versions[$server]}\n";
$stats = $m->getStats();
if ($stats === false || !isset($stats[$server]) || !isset($stats[$server]['pid'])) {
    $fail('getStats() ' . var_export($stats, true));
}
echo "getStats(): " . count($stats[$server]) . " fields\n";
$values = [];
for ($i = 0; $i < 50; $i++) {
    $values["php:$i"] = "value-$i";
}
if (!$m->setMulti($values)) {
    $fail('setMulti()');
}
if ($m->get('php:7') !== 'value-7') {
    $fail('get()');
}
$got = $m->getMulti(array_keys($values));
if ($got != $values) {
    $fail('getMulti() got ' . count($got ?: []) . ' of ' . count($values));
}
if (!$m->delete('php:7') || $m->get('php:7') !== false) {
    $fail('delete()');
}
echo "set, get, getMulti, delete: ok\n";
echo $session;
